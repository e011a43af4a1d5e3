//! Who is calling: the client's address behind trusted proxies (`address`), the address lists that
//! refuse or exempt it (`address_lists`), and the verified consumer — from an API key
//! (`api_keys`), a client certificate (`client_cert`) or a bearer token (`jwt`) — with its plan
//! (`consumers`). An unverified header never names a consumer.

pub(crate) mod address;
pub mod address_lists;
pub mod api_keys;
pub(crate) mod client_cert;
pub(crate) mod consumers;
pub mod jwt;
