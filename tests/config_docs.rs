//! docs/config.md against the config's own declaration (issue 35): the
//! top-level table names every key of `KEYS` and no other, each key's type
//! is the declaration's, each integer key's default and range are the ones
//! `KEYS` and `EngineConfig::default()` hold, and every other default
//! written as JSON is the default's echo. A key added to the code and not
//! to the docs (or the other way round), or a type, default or range
//! changed on one side only, fails here.

use orbite::engine::config::KEYS;
use orbite::EngineConfig;
use std::collections::BTreeMap;

/// The rows of the first table of docs/config.md (the top-level keys):
/// key -> (type, default, range) as written.
fn top_level_rows() -> BTreeMap<String, (String, String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md")).unwrap();
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| Key | Type | Default | Range |") {
            in_table = true;
            continue;
        }
        if in_table && !line.starts_with('|') {
            break;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let key = cells[1].trim_matches('`').to_string();
        let dup = rows.insert(key.clone(), (cells[2].to_string(), cells[3].to_string(), cells[4].to_string()));
        assert!(dup.is_none(), "docs/config.md lists `{key}` twice");
    }
    assert!(!rows.is_empty(), "no key table found in docs/config.md");
    rows
}

/// A number as the docs write it: digits, or digits and a binary unit
/// (`1 GiB`). `None` for anything else (a reference to another key, a
/// formula such as `min(cores, 4)`).
fn number(s: &str) -> Option<u64> {
    let s = s.trim().trim_matches('`');
    let (digits, unit) = s.split_once(' ').unwrap_or((s, ""));
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    Some(n * scale)
}

#[test]
fn the_key_table_names_every_key_the_engine_has() {
    let rows = top_level_rows();
    let declared: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    let missing: Vec<&&str> = declared.iter().filter(|k| !rows.contains_key(**k)).collect();
    assert!(missing.is_empty(), "keys docs/config.md does not document: {missing:?}");
    let extra: Vec<&String> = rows.keys().filter(|k| !declared.contains(&k.as_str())).collect();
    assert!(extra.is_empty(), "docs/config.md documents keys the engine does not have: {extra:?}");
    // The echo writes exactly the declared keys.
    let echoed = EngineConfig::default().to_value();
    let mut echoed: Vec<&str> = echoed.as_object().unwrap().keys().map(String::as_str).collect();
    let mut sorted = declared.clone();
    echoed.sort_unstable();
    sorted.sort_unstable();
    assert_eq!(echoed, sorted);
}

#[test]
fn types_defaults_and_ranges_match_the_declaration() {
    let rows = top_level_rows();
    let defaults = EngineConfig::default();
    for key in KEYS {
        let (ty, default, range) =
            rows.get(key.name).unwrap_or_else(|| panic!("`{}` is not in docs/config.md", key.name));
        assert_eq!(ty, key.ty, "`{}`: the docs' type", key.name);
        let value = key.value(&defaults);
        let Some((min, max)) = key.range else {
            // A default written as JSON is the default's echo.
            let literal = default.trim_matches('`');
            let written: serde_json::Value = serde_json::from_str(literal)
                .unwrap_or_else(|e| panic!("`{}`: default {default:?} is not JSON: {e}", key.name));
            assert_eq!(written, value, "`{}`: the docs' default {default:?}", key.name);
            continue;
        };
        if let Some(d) = number(default) {
            assert_eq!(Some(d), value.as_u64(), "`{}`: the docs' default {default:?}", key.name);
        } else {
            // Only computed defaults are written as formulas.
            assert_eq!(key.name, "io_threads", "`{}`: default {default:?} is not a number", key.name);
        }
        let (lo, hi) = range.split_once(" – ").unwrap_or_else(|| panic!("`{}`: range {range:?}", key.name));
        assert_eq!(number(lo), Some(min), "`{}`: the docs' range {range:?}", key.name);
        // An upper bound written as another key is a relation validate() checks.
        if !hi.starts_with('`') {
            assert_eq!(number(hi), Some(max), "`{}`: the docs' range {range:?}", key.name);
        }
    }
}

/// A config built in Rust is held to the ranges its JSON is: every numeric
/// key one past its maximum fails `validate` naming the key (the two used
/// to be separate lists, and two keys were missing from validate's).
#[test]
fn validate_holds_rust_built_configs_to_every_numeric_range() {
    for key in KEYS {
        let Some((_, max)) = key.range else { continue };
        let mut v = EngineConfig::default().to_value();
        v[key.name] = (max + 1).into();
        let err = EngineConfig::from_json(&v.to_string()).unwrap_err();
        assert!(err.to_string().contains(&format!("`{}`", key.name)), "{err}");
    }
    let c = EngineConfig { min_payload_rate_kib: u32::MAX, ..Default::default() };
    assert!(c.validate().unwrap_err().to_string().contains("`min_payload_rate_kib`"));
    let c = EngineConfig { nvlink_async_memcpy_threshold_kb: u64::MAX, ..Default::default() };
    assert!(c.validate().unwrap_err().to_string().contains("`nvlink_async_memcpy_threshold_kb`"));
}
