//! The console in a real headless Chromium (issue 17; tests/it/browser.rs): signing in through
//! the form as a person does — a wrong password shown and no session, the right one landing on
//! `/people` with a session cookie the page's scripts cannot read (`HttpOnly`) and that the
//! browser holds as `Secure; SameSite=Strict; Path=/`, and signing out ending it. Over plain
//! HTTP on loopback, where Chromium accepts `Secure` cookies.

use serde_json::json;

use crate::browser::{self, Browser};
use crate::console_auth::set_password;
use crate::review_support::{Server, StoreSel, user_with_token};
use crate::support::World;

const PASSWORD: &str = "correct horse battery staple";

#[test]
fn signing_in_and_out_through_the_form_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    let world = World::new();
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    user_with_token(&world, &store, "ana@example.test", "admin");
    set_password(&world, &store, "ana@example.test", PASSWORD).expect_code(0);
    let server = Server::start(&world, &store, &[]);
    let b = Browser::start();

    let sign_in = |password: &str| {
        b.goto(&format!("{}/login", server.base));
        b.get("input[name=email]").type_text("ana@example.test");
        b.get("input[name=password]").type_text(password);
        b.get("button[type=submit]").click();
    };
    // `AIRLOCK_SCREENSHOTS=docs/img` refreshes the pictures docs/console.md shows.
    let shot = |name: &str| {
        if let Some(dir) = std::env::var_os("AIRLOCK_SCREENSHOTS") {
            b.screenshot(&std::path::Path::new(&dir).join(name));
        }
    };
    b.goto(&format!("{}/login", server.base));
    shot("console-login.png");
    sign_in("not the password at all");
    assert!(b.url().ends_with("/login"), "{}", b.url());
    assert!(b.find("[role=alert]").is_some(), "no error shown:\n{}", b.source());
    assert!(
        !b.cookies().iter().any(|c| c["name"] == "__Host-airlock_session"),
        "a wrong password made a session: {:?}",
        b.cookies()
    );

    sign_in(PASSWORD);
    assert!(b.url().ends_with("/people"), "{}\n{}", b.url(), b.source());
    assert!(b.source().contains("signed in as ana@example.test (admin)"), "{}", b.source());
    let cookies = b.cookies();
    let session = cookies
        .iter()
        .find(|c| c["name"] == "__Host-airlock_session")
        .unwrap_or_else(|| panic!("no session cookie: {cookies:?}"));
    assert_eq!(session["httpOnly"], true, "{session}");
    assert_eq!(session["secure"], true, "{session}");
    assert_eq!(session["sameSite"], "Strict", "{session}");
    assert_eq!(session["path"], "/", "{session}");
    let visible = b.eval("return document.cookie", json!([]));
    assert!(!visible.as_str().unwrap_or("").contains("airlock_session"), "{visible}");

    b.get("form[action='/logout'] button").click();
    b.goto(&format!("{}/people", server.base));
    assert!(b.url().ends_with("/login"), "still signed in after signing out: {}", b.url());
}
