//! Hands back the memory a long-lived small process (the session's supervisor and its init)
//! no longer needs once setup is over: the pages of our own executable it mapped while setting
//! up (code and read-only data it will not run again) and malloc's free heap pages (issue 22).
//!
//! Why this is safe: only mappings of the executable that are read-only, private and hold no
//! anonymous (copy-on-write) page are dropped, so every dropped page is an exact copy of the
//! file's page cache and the next access faults the same bytes back in (a minor fault). The
//! relocated read-only data (RELRO) does hold anonymous pages and is left alone. The pages stay
//! in the page cache, shared and reclaimable; the process just stops mapping them, so they no
//! longer count in its RSS and PSS.

use std::io;

/// What [`release_idle_pages`] handed back, in KiB, for logs and the benchmark.
#[derive(Debug, Clone, Copy, Default)]
pub struct Released {
    /// Resident KiB of the dropped executable mappings just before the drop.
    pub exe_kib: u64,
}

/// Calls [`release_idle_pages`] from a small thread after `delay`, so a short-lived process
/// (`airlock exec -- true`) never pays for it and a live session's supervisor does, once.
pub fn release_later(delay: std::time::Duration) {
    let spawned = std::thread::Builder::new()
        .name("airlock-trim".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            std::thread::sleep(delay);
            match release_idle_pages() {
                Ok(r) => tracing::debug!("released {} KiB of setup code pages", r.exe_kib),
                Err(e) => tracing::debug!("cannot release setup pages: {e}"),
            }
        });
    if let Err(e) = spawned {
        tracing::debug!("cannot start the page release: {e}");
    }
}

/// One mapping of /proc/self/smaps that may be dropped.
struct Range {
    start: usize,
    end: usize,
    rss_kib: u64,
}

/// Drops this process's resident pages of its own executable's read-only mappings and trims
/// malloc's free pages. Best effort: any failure leaves memory as it was.
pub fn release_idle_pages() -> io::Result<Released> {
    let ranges = droppable()?;
    // SAFETY: malloc_trim only returns free heap memory to the kernel; no pointer of ours is
    // affected.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    let mut out = Released::default();
    for r in ranges {
        // SAFETY: [start, end) is a whole, page-aligned mapping of our executable that is
        // read-only, private and has no anonymous page (checked in `droppable`): discarding
        // its pages loses nothing, since each later access maps the same file page again.
        // Code running now is in this mapping too; its page simply faults back in on return.
        let rc = unsafe {
            libc::madvise(r.start as *mut libc::c_void, r.end - r.start, libc::MADV_DONTNEED)
        };
        if rc == 0 {
            out.exe_kib += r.rss_kib;
        }
    }
    Ok(out)
}

/// The read-only, private mappings of this process's executable with no anonymous page.
fn droppable() -> io::Result<Vec<Range>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    // The executable is the file mapped where this very function's code is: matched by the
    // device and inode smaps prints, never by path (a path may hold spaces, reads "… (deleted)"
    // after an upgrade) nor by stat(2) (on overlayfs and btrfs its device differs from the one
    // smaps shows).
    let here = droppable as fn() -> io::Result<Vec<Range>> as usize;
    Ok(select(&smaps, here))
}

/// One mapping of an smaps listing (proc(5)).
struct Mapping<'a> {
    range: Range,
    perms: &'a str,
    /// `major:minor` and inode, as printed.
    file: (&'a str, &'a str),
    /// Whether it holds an anonymous (copy-on-write) or swapped page.
    anon: bool,
}

fn mappings(smaps: &str) -> Vec<Mapping<'_>> {
    let mut out: Vec<Mapping<'_>> = Vec::new();
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) =
                (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            let perms = f.next().unwrap_or("");
            let _offset = f.next();
            let dev = f.next().unwrap_or("");
            let inode = f.next().unwrap_or("0");
            out.push(Mapping {
                range: Range { start, end, rss_kib: 0 },
                perms,
                file: (dev, inode),
                anon: false,
            });
            continue;
        }
        let Some(m) = out.last_mut() else { continue };
        let kib = f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match first {
            "Rss:" => m.range.rss_kib = kib,
            // A copy-on-write page (relocations, a debugger's breakpoint) must not be lost.
            "Anonymous:" | "Swap:" if kib > 0 => m.anon = true,
            _ => {}
        }
    }
    out
}

/// The droppable mappings of the file mapped at `code` (read-only, private, no anonymous page).
fn select(smaps: &str, code: usize) -> Vec<Range> {
    let maps = mappings(smaps);
    let Some(exe) = maps
        .iter()
        .find(|m| (m.range.start..m.range.end).contains(&code))
        .map(|m| m.file)
        .filter(|f| f.1 != "0")
    else {
        return Vec::new();
    };
    maps.into_iter()
        .filter(|m| {
            m.file == exe
                && m.perms.starts_with('r')
                && !m.perms.contains('w')
                && m.perms.ends_with('p')
                && !m.anon
        })
        .map(|m| m.range)
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The executable is the file mapped at the given code address, whatever its path or
    /// the device stat(2) would report; its relocated (anonymous) and writable mappings stay.
    #[test]
    fn the_executable_is_the_file_mapped_at_our_code() {
        let smaps = "\
555555554000-555555556000 r--p 00000000 00:2f 1234  /usr/bin/my app (deleted)
Rss:                   8 kB
Anonymous:             0 kB
555555556000-55555555a000 r-xp 00002000 00:2f 1234  /usr/bin/my app (deleted)
Rss:                  16 kB
Anonymous:             0 kB
55555555a000-55555555c000 r--p 00006000 00:2f 1234  /usr/bin/my app (deleted)
Rss:                   8 kB
Anonymous:             4 kB
55555555c000-55555555d000 rw-p 00008000 00:2f 1234  /usr/bin/my app (deleted)
Rss:                   4 kB
Anonymous:             4 kB
7ffff7dd0000-7ffff7df0000 r-xp 00000000 fe:00 99  /usr/lib/libc.so.6
Rss:                  64 kB
Anonymous:             0 kB
7ffff7ff0000-7ffff7ff1000 rw-p 00000000 00:00 0
Rss:                   4 kB
Anonymous:             4 kB
";
        let got: Vec<(usize, u64)> =
            select(smaps, 0x555555557000).iter().map(|r| (r.start, r.rss_kib)).collect();
        assert_eq!(got, [(0x555555554000, 8), (0x555555556000, 16)]);
        // Code outside any file mapping (or in an anonymous one) selects nothing.
        assert!(select(smaps, 0x1000).is_empty());
        assert!(select(smaps, 0x7ffff7ff0800).is_empty());
    }

    #[test]
    fn drops_code_pages_and_keeps_running() {
        let before = droppable().unwrap();
        assert!(!before.is_empty(), "the test binary's own code is a candidate");
        let released = release_idle_pages().unwrap();
        assert!(released.exe_kib > 0);
        // Code and relocated data still work after the drop (a vtable call, a formatted
        // string, a panic-free allocation).
        let v: Vec<Box<dyn std::fmt::Debug>> = vec![Box::new(1u8), Box::new("x")];
        assert_eq!(format!("{v:?}"), "[1, \"x\"]");
    }
}
