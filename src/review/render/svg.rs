//! Charts drawn on the server as inline SVG (no chart library, nothing fetched): the 7-day
//! activity sparkline of `/people` and the events-per-hour chart of a timeline. Colours come
//! from the stylesheet's classes (`al` allowed, `de` denied, `tr` transcript, `fl` flag);
//! each chart has a `<title>` and an `aria-label` so it reads without the picture.

use super::{HOUR, Micros, when};
use maud::{Markup, html};

/// A 7-day sparkline: one bar per day, oldest first, scaled to the busiest day.
pub fn sparkline(daily: &[u64; 7]) -> Markup {
    const W: u64 = 10;
    const H: u64 = 18;
    let max = daily.iter().copied().max().unwrap_or(0).max(1);
    let label = format!(
        "events per day, last 7 days, oldest first: {}",
        daily.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    );
    html! {
        svg.spark width=(W * 7) height=(H) viewBox=(format!("0 0 {} {H}", W * 7)) role="img" aria-label=(label) {
            title { (label) }
            @for (i, n) in daily.iter().enumerate() {
                @let h = if *n == 0 { 0 } else { (n * (H - 2) / max).max(1) };
                rect.tr x=(i as u64 * W + 1) y=(H - h) width=(W - 2) height=(h) {}
            }
            line.ax x1="0" y1=(H) x2=(W * 7) y2=(H) {}
        }
    }
}

/// One hour of a timeline's chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HourBucket {
    /// Start of the hour (microseconds, UTC).
    pub start: Micros,
    /// Egress attempts allowed, denied; transcript lines; flags raised on events of the hour.
    pub allowed: u32,
    pub denied: u32,
    pub transcript: u32,
    pub flags: u32,
}

impl HourBucket {
    /// The three series together.
    pub fn total(&self) -> u32 {
        self.allowed.saturating_add(self.denied).saturating_add(self.transcript)
    }
}

/// The events-per-hour chart: stacked bars (allowed, denied, transcript), a flag mark over
/// hours with flags, each bar a link from `href(start, end)` narrowing the range to its hour
/// (empty hours have none).
pub fn hour_chart(buckets: &[HourBucket], href: &dyn Fn(Micros, Micros) -> String) -> Markup {
    const H: u32 = 80;
    const TOP: u32 = 10;
    let bw: u32 = match buckets.len() {
        0..=48 => 20,
        49..=168 => 6,
        _ => 3,
    };
    let width = (buckets.len() as u32).max(1) * bw;
    let max = buckets.iter().map(HourBucket::total).max().unwrap_or(0).max(1);
    let scale = |n: u32| -> u32 {
        if n == 0 { 0 } else { (u64::from(n) * u64::from(H) / u64::from(max)).max(1) as u32 }
    };
    let label =
        format!("events per hour, {} hours; click a bar to narrow the range to it", buckets.len());
    html! {
        svg.chart width=(width) height=(H + TOP + 2) viewBox=(format!("0 0 {width} {}", H + TOP + 2)) role="img" aria-label=(label) {
            title { (label) }
            // Empty hours are left blank: nothing to narrow to.
            @for (i, b) in buckets.iter().enumerate().filter(|(_, b)| b.total() > 0 || b.flags > 0) {
                @let x = i as u32 * bw;
                @let (ha, hd, ht) = (scale(b.allowed), scale(b.denied), scale(b.transcript));
                @let base = TOP + H;
                a href=(href(b.start, b.start + HOUR)) {
                    title {
                        (when(b.start)) ": " (b.allowed) " allowed, " (b.denied) " denied, "
                        (b.transcript) " transcript lines" @if b.flags > 0 { ", " (b.flags) " flags" }
                    }
                    // A transparent full-height target, so short bars are easy to hit.
                    rect x=(x) y="0" width=(bw) height=(base) fill="transparent" {}
                    @if ha > 0 { rect.al x=(x + 1) y=(base - ha) width=(bw - 2) height=(ha) {} }
                    @if hd > 0 { rect.de x=(x + 1) y=(base - ha - hd) width=(bw - 2) height=(hd) {} }
                    @if ht > 0 { rect.tr x=(x + 1) y=(base - ha - hd - ht) width=(bw - 2) height=(ht) {} }
                    @if b.flags > 0 {
                        polygon.fl points=(format!("{},{} {},{} {},{}", x + 1, 0, x + bw - 1, 0, x + bw / 2, TOP - 2)) {}
                    }
                }
            }
            line.ax x1="0" y1=(TOP + H) x2=(width) y2=(TOP + H) {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::render::testutil::assert_no_urls;

    #[test]
    fn sparkline_scales_to_the_busiest_day() {
        let s = sparkline(&[0, 1, 2, 4, 0, 0, 16]).into_string();
        assert!(s.starts_with("<svg class=\"spark\""));
        assert!(!s.contains("xmlns"), "inline SVG needs no namespace URL");
        assert_eq!(s.matches("<rect").count(), 7);
        assert!(s.contains(r#"height="16""#), "the busiest day is full height");
        assert!(s.contains("oldest first: 0, 1, 2, 4, 0, 0, 16"));
        assert_no_urls(&s);
        assert!(sparkline(&[0; 7]).into_string().contains(r#"height="0""#));
    }

    #[test]
    fn hour_chart_links_each_bar_and_marks_flags() {
        let b = [
            HourBucket { start: 0, allowed: 3, denied: 1, transcript: 4, flags: 0 },
            HourBucket { start: HOUR, flags: 2, ..Default::default() },
        ];
        let s = hour_chart(&b, &|a, z| format!("?from={a}&until={z}")).into_string();
        assert!(s.contains(r#"<a href="?from=0&amp;until=3600000000">"#));
        assert!(s.contains(r#"<a href="?from=3600000000&amp;until=7200000000">"#));
        assert_eq!(s.matches("<polygon").count(), 1, "one hour has flags");
        assert!(s.contains("3 allowed, 1 denied, 4 transcript lines"));
        assert!(s.contains(", 2 flags"));
        let empty = [HourBucket { start: 0, ..Default::default() }];
        assert!(!hour_chart(&empty, &|_, _| String::new()).into_string().contains("<a"));
        assert_no_urls(&s);
    }
}
