//! The one way two per-limit sequences meet by position: each element with the one at its
//! place, and a [`Mismatch`] when the lengths differ (`zip` would silently drop the longer
//! one's tail). A mismatch is a bug, never a request's fault: whoever meets one counts it and
//! says so (a limiter call fails with `LimiterError::Mismatch`, counted under
//! `sluice_limiter_errors_total{kind="mismatch"}`; the layers above count theirs under
//! `sluice_internal_mismatches_total`).

/// Two per-limit sequences that should have been one for one, and were not: where, and their
/// lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {left} against {right}, where there should be one for one")]
pub struct Mismatch {
    /// What was paired (`"limits and records"`), for the log line and the metric label.
    pub at: &'static str,
    pub left: usize,
    pub right: usize,
}

/// The one join of two per-limit sequences: each element of `a` with the one of `b` at its
/// place; `Err` naming `at` when their lengths differ.
pub fn paired<'a, 'b, A, B>(
    at: &'static str,
    a: &'a [A],
    b: &'b [B],
) -> Result<impl Iterator<Item = (&'a A, &'b B)>, Mismatch> {
    check(at, a.len(), b.len())?;
    Ok(a.iter().zip(b))
}

/// [`paired`], with the second sequence's elements mutable.
pub fn paired_mut<'a, 'b, A, B>(
    at: &'static str,
    a: &'a [A],
    b: &'b mut [B],
) -> Result<impl Iterator<Item = (&'a A, &'b mut B)>, Mismatch> {
    check(at, a.len(), b.len())?;
    Ok(a.iter().zip(b))
}

fn check(at: &'static str, left: usize, right: usize) -> Result<(), Mismatch> {
    match left == right {
        true => Ok(()),
        false => Err(Mismatch { at, left, right }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_of_one_length_pair_one_for_one() {
        let pairs: Vec<_> = paired("t", &[1, 2], &["a", "b"])
            .expect("one for one")
            .collect();
        assert_eq!(pairs, [(&1, &"a"), (&2, &"b")]);
        let mut b = [0, 0];
        for (a, b) in paired_mut("t", &[3, 4], &mut b).expect("one for one") {
            *b = *a;
        }
        assert_eq!(b, [3, 4]);
    }

    #[test]
    fn sequences_of_different_lengths_are_a_mismatch_not_a_shorter_pairing() {
        let error = paired("limits and records", &[1, 2, 3], &[1, 2]).err();
        let mismatch = Mismatch {
            at: "limits and records",
            left: 3,
            right: 2,
        };
        assert_eq!(error, Some(mismatch));
        assert_eq!(
            mismatch.to_string(),
            "limits and records: 3 against 2, where there should be one for one"
        );
        let mut b: [u8; 0] = [];
        assert!(paired_mut("t", &[1], &mut b).is_err());
    }
}
