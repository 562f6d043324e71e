//! A small SVG line chart: throughput against block size (log scale),
//! one solid line per transport and op, baselines dashed.

use crate::Point;
use std::collections::BTreeMap;
use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 540.0;
const L: f64 = 80.0;
const R: f64 = 220.0;
const T: f64 = 50.0;
const B: f64 = 70.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];

fn size_label(b: u64) -> String {
    if b >= 1 << 30 && b % (1 << 30) == 0 {
        format!("{}GiB", b >> 30)
    } else if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

/// Renders the chart.
pub fn svg(points: &[Point], title: &str) -> String {
    let mut series: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    let mut baselines: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for p in points {
        let who = if p.readers > 1 { format!(" x{}", p.readers) } else { String::new() };
        series.entry(format!("{} {}{who}", p.transport, p.op)).or_default().push((p.block_size, p.gbps));
        if p.baseline_gbps > 0.0 {
            baselines.entry(format!("{} (baseline)", p.baseline)).or_default().push((p.block_size, p.baseline_gbps));
        }
    }
    for v in series.values_mut().chain(baselines.values_mut()) {
        v.sort_by_key(|x| x.0);
        v.dedup_by_key(|x| x.0);
    }
    let xs: Vec<u64> = points.iter().map(|p| p.block_size).collect();
    let (xmin, xmax) =
        (xs.iter().copied().min().unwrap_or(1).max(1) as f64, xs.iter().copied().max().unwrap_or(2).max(2) as f64);
    let ymax = points.iter().map(|p| p.gbps.max(p.baseline_gbps)).fold(0.1f64, f64::max) * 1.1;
    let (lx0, lx1) = (xmin.log2(), if xmax > xmin { xmax.log2() } else { xmin.log2() + 1.0 });
    let px = |x: u64| L + ((x as f64).log2() - lx0) / (lx1 - lx0) * (W - L - R);
    let py = |y: f64| H - B - y / ymax * (H - T - B);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="25" text-anchor="middle" font-size="16">{}</text>
"#,
        (W - R + L) / 2.0,
        xml(title)
    );
    // Axes, grid and ticks.
    let _ = writeln!(s, r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, H - B, W - R, H - B);
    let _ = writeln!(s, r#"<line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>"#, H - B);
    for i in 0..=5 {
        let y = ymax * i as f64 / 5.0;
        let yy = py(y);
        let _ = writeln!(s, r##"<line x1="{L}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/>"##, W - R);
        let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">{y:.1}</text>"#, L - 6.0, yy + 4.0);
    }
    let mut ticks = xs.clone();
    ticks.sort_unstable();
    ticks.dedup();
    for x in ticks {
        let xx = px(x);
        let _ = writeln!(s, r#"<text x="{xx}" y="{}" text-anchor="middle">{}</text>"#, H - B + 18.0, size_label(x));
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">block size</text>"#, (W - R + L) / 2.0, H - 25.0);
    let _ = writeln!(
        s,
        r#"<text x="20" y="{}" text-anchor="middle" transform="rotate(-90 20 {})">throughput (GB/s, 1e9 bytes/s)</text>"#,
        (H - B + T) / 2.0,
        (H - B + T) / 2.0
    );
    let mut legend_y = T + 10.0;
    let mut draw = |s: &mut String, name: &str, pts: &[(u64, f64)], color: &str, dashed: bool| {
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
        let dash = if dashed { r#" stroke-dasharray="6,4""# } else { "" };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        if !dashed {
            for (x, y) in pts {
                let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(*x), py(*y));
            }
        }
        let lx = W - R + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{color}" stroke-width="2"{dash}/>"#,
            lx + 25.0
        );
        let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, lx + 30.0, legend_y + 4.0, xml(name));
        legend_y += 18.0;
    };
    for (i, (name, pts)) in series.iter().enumerate() {
        draw(&mut s, name, pts, COLORS[i % COLORS.len()], false);
    }
    for (i, (name, pts)) in baselines.iter().enumerate() {
        draw(&mut s, name, pts, if i == 0 { "#555" } else { "#999" }, true);
    }
    s.push_str("</svg>\n");
    s
}

fn xml(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
