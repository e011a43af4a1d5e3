//! What a request meets, compiled at load: the route table (`table`: host, path, method → route,
//! found through `index` without trying every route),
//! the one spelling of a path (`path`), each route's tiers of limits per kind of caller
//! (`tiers`), the keys a request is counted under (`keys`), where priced limits read their cost
//! (`pricing`), the route's upstream as configured (`upstream`), and, for the rate limit
//! service, the descriptor rules of each domain (`descriptors`); and the quota admin API's
//! temporary overrides of limits, compiled into the tiers callers then meet (`overrides`); and
//! routes and limits told back in the configuration's words (`describe`).

pub mod describe;
pub(crate) mod descriptors;
mod index;
pub mod keys;
pub mod overrides;
pub mod path;
pub(crate) mod pricing;
pub mod table;
pub(crate) mod tiers;
pub(crate) mod upstream;
