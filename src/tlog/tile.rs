//! C2SP `tlog-tiles` paths: `tile/<L>/<N>[.p/<W>]`, where `N` is written in groups of three
//! digits, every group but the last prefixed with `x` (`1234067` → `x001/x234/067`), and a
//! partial tile of `W` (1–255) hashes has the `.p/<W>` suffix. Airlock serves hash tiles only;
//! `tile/entries/…` (entry bundles) would publish leaf preimages and is refused.

use super::merkle::TILE_WIDTH;

/// A parsed tile path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePath {
    pub level: u8,
    pub index: u64,
    /// Hashes in the tile: 256 for a full tile, 1–255 for a partial one.
    pub width: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TilePathError {
    #[error("entry tiles are not served: they would publish leaf preimages (docs/evidence.md)")]
    Entries,
    #[error("malformed tile path {0:?}: expected <L>/<N>[.p/<W>] (C2SP tlog-tiles)")]
    Malformed(String),
}

/// The highest tier a tree of 2^64 leaves can have.
pub const MAX_LEVEL: u8 = 7;

/// Encodes `N` as C2SP path elements.
pub fn encode_index(n: u64) -> String {
    let digits = n.to_string();
    let pad = (3 - digits.len() % 3) % 3;
    let padded = format!("{}{digits}", "0".repeat(pad));
    let groups: Vec<&str> =
        padded.as_bytes().chunks(3).filter_map(|c| std::str::from_utf8(c).ok()).collect();
    let last = groups.len() - 1;
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| if i < last { format!("x{g}") } else { (*g).to_string() })
        .collect::<Vec<_>>()
        .join("/")
}

impl TilePath {
    /// The path after `tile/`.
    pub fn to_path(&self) -> String {
        let mut p = format!("{}/{}", self.level, encode_index(self.index));
        if self.width < TILE_WIDTH {
            p.push_str(&format!(".p/{}", self.width));
        }
        p
    }

    /// Parses the part after `tile/`.
    pub fn parse(path: &str) -> Result<Self, TilePathError> {
        let bad = || TilePathError::Malformed(path.to_string());
        if path == "entries" || path.starts_with("entries/") {
            return Err(TilePathError::Entries);
        }
        let (level_text, rest) = path.split_once('/').ok_or_else(bad)?;
        let level: u8 = level_text.parse().map_err(|_| bad())?;
        if level > MAX_LEVEL || level_text != level.to_string() {
            return Err(bad());
        }
        let (index_text, width) = match rest.split_once(".p/") {
            Some((i, w)) => {
                let width: u64 = w.parse().map_err(|_| bad())?;
                if !(1..TILE_WIDTH).contains(&width) || w != width.to_string() {
                    return Err(bad());
                }
                (i, width)
            }
            None => (rest, TILE_WIDTH),
        };
        let elems: Vec<&str> = index_text.split('/').collect();
        let last = elems.len() - 1;
        let mut digits = String::new();
        for (i, e) in elems.iter().enumerate() {
            let g = if i < last { e.strip_prefix('x').ok_or_else(bad)? } else { e };
            if g.len() != 3 || !g.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            digits.push_str(g);
        }
        let index: u64 = digits.parse().map_err(|_| bad())?;
        // One spelling per index: no extra leading groups of zeros.
        if encode_index(index) != index_text {
            return Err(bad());
        }
        Ok(Self { level, index, width })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn c2sp_examples() {
        assert_eq!(encode_index(1234067), "x001/x234/067");
        assert_eq!(encode_index(0), "000");
        assert_eq!(encode_index(5), "005");
        let t = TilePath::parse("0/x001/x234/067.p/8").unwrap();
        assert_eq!(t, TilePath { level: 0, index: 1234067, width: 8 });
        assert_eq!(t.to_path(), "0/x001/x234/067.p/8");
        assert_eq!(TilePath::parse("1/000").unwrap().width, 256);
        assert_eq!(TilePath::parse("entries/000"), Err(TilePathError::Entries));
        for bad in [
            "0/1",
            "0/x000/001",
            "0/000.p/0",
            "0/000.p/256",
            "8/000",
            "00/000",
            "0/00a",
            "0/000.p/01",
            "0",
        ] {
            assert!(TilePath::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn paths_roundtrip(level in 0u8..=7, index in any::<u64>(), width in 1u64..=256) {
            let t = TilePath { level, index, width };
            prop_assert_eq!(TilePath::parse(&t.to_path()).unwrap(), t);
        }
        #[test]
        fn parsing_never_panics(s in "\\PC{0,40}") {
            let _ = TilePath::parse(&s);
        }
    }
}
