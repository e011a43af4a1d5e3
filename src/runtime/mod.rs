//! What runs while a configuration is in force: the snapshot (a site, its health checks and JWKS
//! refresh; `snapshot`), the configuration service that builds the next one on SIGHUP or when a
//! file it read changes and swaps it in (`reload`), the keeper of the quota overrides in force
//! (`overrides`, which writes them back when Redis lost them), whether the quotas in force
//! survive Redis restarting (`durability`), the sampler of the dashboard's live decisions
//! (`sampler`), the one owner that starts those three and the limiter's connection keeper
//! once (`background`), `-d`'s launcher (`daemon`), and the memory a configuration's reading
//! freed handed back (`memory`).

pub mod background;
pub mod daemon;
pub mod durability;
pub mod memory;
pub mod overrides;
pub mod regions;
pub(crate) mod reload;
pub mod sampler;
pub mod snapshot;
