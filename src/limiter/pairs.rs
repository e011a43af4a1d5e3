//! The one way two per-limit sequences meet by position: each element with the one at its
//! place, refused when the lengths differ (`zip` would silently drop the longer one's tail).

/// The one join of two per-limit sequences: each element of `a` with the one of `b` at its
/// place; `None` when their lengths differ (where `zip` would drop the longer one's tail).
pub fn paired<'a, 'b, A, B>(
    a: &'a [A],
    b: &'b [B],
) -> Option<impl Iterator<Item = (&'a A, &'b B)>> {
    (a.len() == b.len()).then(|| a.iter().zip(b))
}

/// [`paired`], with the second sequence's elements mutable.
pub fn paired_mut<'a, 'b, A, B>(
    a: &'a [A],
    b: &'b mut [B],
) -> Option<impl Iterator<Item = (&'a A, &'b mut B)>> {
    (a.len() == b.len()).then(|| a.iter().zip(b))
}
