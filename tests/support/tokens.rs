//! JWT support for end-to-end tests: keys of each family (RSA, EC P-256/P-384, Ed25519, HMAC),
//! tokens signed with given claims, `kid` and `alg`, the forged tokens the gateway must refuse
//! (`alg: none`, HS256 signed with an RSA public key), JWKS documents, and a JWKS HTTP server on
//! a free loopback port whose answer can be swapped (key rotation) or made to fail at runtime,
//! stopped when dropped. The same helpers the library's own tests use (`sluice::caller::jwt::testing`).

#[allow(unused_imports)] // each test file uses some of them
pub use sluice::caller::jwt::testing::{
    claims, hs256_with_public_key, jwks, now, unsigned_token, Family, JwksServer, Served, TestKey,
};
pub use sluice::caller::jwt::Algorithm;

/// A key of each asymmetric family with its usual algorithm, named `<prefix>-rsa`, `-ec256`,
/// `-ec384`, `-ed`.
pub fn one_of_each(prefix: &str) -> Vec<TestKey> {
    [
        (Family::Rsa, Algorithm::RS256, "rsa"),
        (Family::P256, Algorithm::ES256, "ec256"),
        (Family::P384, Algorithm::ES384, "ec384"),
        (Family::Ed25519, Algorithm::EdDSA, "ed"),
    ]
    .into_iter()
    .map(|(family, alg, name)| TestKey::generate(family, alg, Some(&format!("{prefix}-{name}"))))
    .collect()
}

/// Writes a JWKS document of `keys` to `path` (for `jwt.jwks_file`).
pub fn write_jwks(path: &std::path::Path, keys: &[&TestKey]) {
    std::fs::write(path, jwks(keys)).expect("write the JWKS file");
}
