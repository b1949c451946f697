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

use std::io::{self, BufRead, BufReader};

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

/// The read-only, private mappings of /proc/self/exe with no anonymous page.
fn droppable() -> io::Result<Vec<Range>> {
    // The executable is matched by device and inode, not by path: a path may hold spaces,
    // and after an upgrade during a long session it reads "… (deleted)".
    let exe = {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/proc/self/exe")?;
        (dev_field(m.dev()), m.ino())
    };
    let smaps = BufReader::new(std::fs::File::open("/proc/self/smaps")?);
    let mut out = Vec::new();
    // The mapping being read: (range, still a candidate).
    let mut cur: Option<(Range, bool)> = None;
    for line in smaps.lines() {
        let line = line?;
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) =
                (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            if let Some((r, true)) = cur.take() {
                out.push(r);
            }
            let perms = f.next().unwrap_or("");
            let _offset = f.next();
            let dev = f.next().unwrap_or("");
            let inode = f.next().and_then(|i| i.parse::<u64>().ok());
            let candidate = perms.starts_with('r')
                && !perms.contains('w')
                && perms.ends_with('p')
                && dev == exe.0
                && inode == Some(exe.1);
            cur = Some((Range { start, end, rss_kib: 0 }, candidate));
            continue;
        }
        let Some((r, candidate)) = cur.as_mut() else { continue };
        let kib = f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match first {
            "Rss:" => r.rss_kib = kib,
            // A copy-on-write page (relocations, a debugger's breakpoint) must not be lost.
            "Anonymous:" | "Swap:" if kib > 0 => *candidate = false,
            _ => {}
        }
    }
    if let Some((r, true)) = cur {
        out.push(r);
    }
    Ok(out)
}

/// `st_dev` as /proc/<pid>/smaps prints it (`major:minor` in hex, proc(5)), with glibc's
/// encoding of the two numbers (makedev(3)).
fn dev_field(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major:02x}:{minor:02x}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

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
