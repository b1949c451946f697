//! placeholder
pub mod splice;
