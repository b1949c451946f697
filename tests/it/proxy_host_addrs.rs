//! The address guard follows the host's interface addresses (rtnetlink), not a set read once
//! per session: inside a user and network namespace this test makes (`unshare -rn`, only `lo`),
//! the standalone proxy starts, then an address is added to `lo` and a CONNECT to a name the
//! injected resolver maps to it is refused as the host's own (`private_address`); removed
//! again, it is not. Everything happens inside that namespace: the address (11.9.9.9, public
//! unicast, so only the host-address rule can refuse it) exists nowhere else, and before it is
//! added the proxy's dial fails with no route (`ENETUNREACH`) — nothing can leave a namespace
//! that has only `lo`.

use std::io::Write;
use std::time::Duration;

use crate::proxy_support::{ProxyProc, read_head};
use crate::support::{World, have, in_ci, wait_until};

/// Set for the inner run; the inner test refuses to run without it.
const INNER: &str = "AIRLOCK_IT_HOST_ADDRS_INNER";
const ADDR: &str = "11.9.9.9";

#[test]
fn the_address_guard_follows_address_changes_inside_a_fresh_netns() {
    if !have("unshare") {
        return;
    }
    let ip = std::path::Path::new("/usr/sbin/ip");
    assert!(ip.exists() || !in_ci(), "prerequisite /usr/sbin/ip missing (CI must have it)");
    if !ip.exists() {
        eprintln!("SKIP: /usr/sbin/ip not installed");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let name = "proxy_host_addrs::inner_the_guard_follows_lo_addresses";
    let out = std::process::Command::new("unshare")
        .arg("-rn")
        .arg(exe)
        .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .env(INNER, "1")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("/usr/sbin/ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// One CONNECT through the proxy: the status line and the `X-Airlock-Reason`.
fn connect(proxy: &ProxyProc) -> (String, String) {
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"CONNECT own.test:443 HTTP/1.1\r\nHost: own.test:443\r\n\r\n").unwrap();
    let head = read_head(&mut s);
    let status = head.lines().next().unwrap_or("").to_owned();
    let reason = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("x-airlock-reason: ").map(str::to_owned))
        .unwrap_or_default();
    (status, reason)
}

#[test]
#[ignore = "run by the_address_guard_follows_address_changes_inside_a_fresh_netns inside unshare -rn"]
fn inner_the_guard_follows_lo_addresses() {
    assert!(std::env::var_os(INNER).is_some(), "only inside the outer test's namespace");
    // Safety: this must be a fresh network namespace with nothing but `lo` (/proc/self/net
    // is the calling thread's namespace; /sys/class/net would show the mounter's).
    let dev = std::fs::read_to_string("/proc/self/net/dev").unwrap();
    let devices: Vec<&str> =
        dev.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    assert_eq!(devices, ["lo"], "not a fresh network namespace; refusing to run");
    ip(&["link", "set", "lo", "up"]);

    let world = World::new();
    let proxy = ProxyProc::start(
        &world,
        "hostaddrs",
        "[network]\nallow = [\"own.test\"]\n",
        &format!("own.test {ADDR}\n"),
        &[],
    );
    // Before: not a host address, so the proxy dials it — and finds no route (502).
    let (status, reason) = connect(&proxy);
    assert!(status.starts_with("HTTP/1.1 502"), "{status} {reason}");
    assert_eq!(reason, "connect_failed");

    // Added after the proxy started: refused as the host's own from then on.
    ip(&["addr", "add", &format!("{ADDR}/32"), "dev", "lo"]);
    let mut last = (String::new(), String::new());
    let refused = wait_until(Duration::from_secs(20), || {
        last = connect(&proxy);
        last.1 == "private_address"
    });
    assert!(refused, "never refused as a host address; last answer {last:?}");
    assert!(last.0.starts_with("HTTP/1.1 403"), "{last:?}");

    // Removed: no longer the host's (the dial fails again).
    ip(&["addr", "del", &format!("{ADDR}/32"), "dev", "lo"]);
    let back = wait_until(Duration::from_secs(20), || {
        last = connect(&proxy);
        last.1 == "connect_failed"
    });
    assert!(back, "still refused after the address went away; last answer {last:?}");

    let lines = proxy.audit();
    let guard: Vec<_> = lines.iter().filter(|l| l["reason"] == "private_address").collect();
    assert!(!guard.is_empty(), "{lines:#?}");
    assert!(guard.iter().all(|l| l["host"] == "own.test" && l["allowed"] == false), "{guard:#?}");
}
