//! What the gateway tells its operator: metric families (`metrics`, and `sharded`: the meters
//! every request writes, one slot per thread; the handles a request counts
//! through are the exchange's, `exchange::meters`), the access log (`access_log`: its buffer,
//! writer thread and file), spans sent over OTLP (`traces`), the process log (`logging`), the quota admin audit log (`audit`) and the dashboard's live
//! views (`live`: decisions per second, the most limited keys and consumers, the last reloads).

pub(crate) mod access_log;
pub mod audit;
pub mod live;
pub mod logging;
pub(crate) mod metrics;
pub mod sharded;
pub(crate) mod traces;
