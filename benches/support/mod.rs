//! Pieces several loopback benches share (included with `mod support;`).

use std::net::IpAddr;

use airlock::proxy::Resolver;
use airlock::proxy::resolver::Resolving;

/// Maps every name to one loopback address (no DNS anywhere).
#[derive(Debug)]
pub struct Fixed(pub IpAddr);

impl Resolver for Fixed {
    fn resolve<'a>(&'a self, _name: &'a str) -> Resolving<'a> {
        let ip = self.0;
        Box::pin(async move { Ok(vec![ip]) })
    }
}
