//! placeholder
pub mod head;
pub mod resolver;
pub mod splice;
pub mod tls_peek;
