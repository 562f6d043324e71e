use super::*;

fn err(text: &str) -> String {
    match EngineConfig::from_json(text) {
        Err(Error::InvalidConfig(m)) => m,
        other => panic!("expected InvalidConfig for {text}, got {other:?}"),
    }
}

#[test]
fn empty_and_braces_give_defaults() {
    assert_eq!(EngineConfig::from_json("").unwrap(), EngineConfig::default());
    assert_eq!(EngineConfig::from_json(" {} ").unwrap(), EngineConfig::default());
}

#[test]
fn round_trips_through_json() {
    let c = EngineConfig {
        mnnvl: Some(MnnvlConfig {
            handle_type: MnnvlHandleType::PosixFd,
            fabric_domain: FabricDomain::Fixed([7u8; 16]),
            host_register: false,
            egm: true,
        }),
        max_transfer_bytes: 8 * MIB,
        transport_policy: vec![TransportKind::Tcp, TransportKind::Shm],
        auth_key_file: Some("/etc/orbite/key".into()),
        ipc_allowed_uids: vec![0, 1000],
        cma: false,
        cma_ptracer: PtracerPolicy::Any,
        offer_timeout_ms: 250,
        min_payload_rate_kib: 0,
        max_ipc_channels: 3,
        io_threads: 7,
        io_poll_us: 0,
        name: Some("prefill-0".into()),
        notification_max_bytes: 100,
        notification_queue: 7,
        discovery: Some(DiscoveryConfig {
            etcd: vec!["http://127.0.0.1:2379".into(), "http://etcd-1:2379".into()],
            prefix: "/cluster-a".into(),
            ttl_s: 4,
        }),
        ..EngineConfig::default()
    };
    assert_eq!(EngineConfig::from_json(&c.to_json()).unwrap(), c);
    let d = EngineConfig::default();
    assert_eq!(EngineConfig::from_json(&d.to_json()).unwrap(), d);
}

#[test]
fn unknown_keys_are_named() {
    assert!(err(r#"{"max_inflite_bytes": 5}"#).contains("`max_inflite_bytes`"));
    assert!(err(r#"{"mnnvl": {"egmm": true}}"#).contains("`mnnvl.egmm`"));
    assert!(err(r#"{"name": "a", "discovery": {"etcd": ["http://h:1"], "ttl": 3}}"#).contains("`discovery.ttl`"));
}

/// serde_json keeps the last of two equal keys; the config refuses
/// them instead, naming the key (nested ones by their path).
#[test]
fn duplicate_keys_are_refused_and_named() {
    let e = EngineConfig::from_json(r#"{"io_threads": 1, "io_threads": 8}"#).unwrap_err();
    assert!(matches!(&e, Error::InvalidConfig(m) if m.contains("key `io_threads` appears twice")), "{e}");
    let nested = r#"{"name": "a", "discovery": {"etcd": ["http://h:1"], "prefix": "/x", "prefix": "/y"}}"#;
    assert!(err(nested).contains("key `discovery.prefix` appears twice"));
}

#[test]
fn wrong_types_are_named() {
    assert!(err(r#"{"nvlink": 1}"#).contains("`nvlink`: expected a boolean"));
    assert!(err(r#"{"max_inflight_bytes": "1"}"#).contains("`max_inflight_bytes`"));
    assert!(err(r#"{"nvlink_stream_count": -1}"#).contains("negative"));
    assert!(err(r#"{"mnnvl": 5}"#).contains("`mnnvl`: expected an object or null"));
    assert!(err(r#"[1]"#).contains("expected a JSON object"));
    assert!(err(r#"{"#).contains("not valid JSON"));
}

#[test]
fn ranges_are_enforced() {
    assert!(err(r#"{"nvlink_cache_entries": 4097}"#).contains("0..=4096"));
    assert!(EngineConfig::from_json(r#"{"nvlink_cache_entries": 4096}"#).is_ok());
    assert!(err(r#"{"nvlink_stream_count": 0}"#).contains("1..=4096"));
    assert!(err(r#"{"shm_cache_entries": 5000}"#).contains("`shm_cache_entries`"));
    assert!(err(r#"{"default_timeout_ms": 0}"#).contains("`default_timeout_ms`"));
    assert!(err(r#"{"max_inflight_bytes": 1024}"#).contains("`max_inflight_bytes`"));
    assert!(
        err(r#"{"max_inflight_bytes": 2097152, "max_transfer_bytes": 4194304}"#).contains("exceeds max_inflight_bytes")
    );
    assert!(err(r#"{"mnnvl": {"async_memcpy_threshold": 70000}}"#).contains("`mnnvl.async_memcpy_threshold`"));
}

/// max_transfer_bytes may equal max_inflight_bytes (one chunk fills the
/// budget and is admitted alone); one byte more is refused naming both.
/// Guards `validate`'s `self.max_transfer_bytes > self.max_inflight_bytes`
/// (round 17 R1: with `>=` the equal config was refused).
#[test]
fn max_transfer_bytes_may_equal_max_inflight_bytes() {
    let c = EngineConfig::from_json(r#"{"max_inflight_bytes": 4194304, "max_transfer_bytes": 4194304}"#).unwrap();
    assert_eq!((c.max_transfer_bytes, c.max_inflight_bytes), (4 * MIB, 4 * MIB));
    let said = err(r#"{"max_inflight_bytes": 4194304, "max_transfer_bytes": 4194305}"#);
    assert!(said.contains("4194305 exceeds max_inflight_bytes (4194304)"), "{said}");
}

/// A config built in Rust (no JSON parse to check it first) is held to
/// each key's lower bound by `validate`, as to its upper: io_threads 0,
/// default_timeout_ms 0 and a max_inflight_bytes under its minimum are
/// refused naming the key and its range; the defaults pass. Guards
/// `validate`'s `v < min ||` (round 9 I18: with only `v > max` checked an
/// engine built from such a config had no I/O thread, or timed every
/// request out at once).
#[test]
fn a_config_built_in_rust_is_held_to_each_lower_bound() {
    let refused = |c: EngineConfig| c.validate().unwrap_err().to_string();
    assert!(EngineConfig::default().validate().is_ok());
    let said = refused(EngineConfig { io_threads: 0, ..EngineConfig::default() });
    assert!(said.contains("`io_threads`") && said.contains("0 is outside the range 1..="), "{said}");
    let said = refused(EngineConfig { default_timeout_ms: 0, ..EngineConfig::default() });
    assert!(said.contains("`default_timeout_ms`") && said.contains("0 is outside the range 1..="), "{said}");
    let said = refused(EngineConfig { max_inflight_bytes: 1024, ..EngineConfig::default() });
    assert!(said.contains("`max_inflight_bytes`") && said.contains("1024 is outside the range"), "{said}");
}

/// A discovery lease built in Rust is held to 1..=3600 s, as JSON's is (JSON
/// is refused by its reader first, so only `validate` sees a Rust value):
/// a lease of 3601 s is refused naming the key, and 3600 is taken. Guards
/// `check_discovery`'s `d.ttl_s > 3600` (round 11 K8: a dead engine's name
/// held for hours).
#[test]
fn a_discovery_lease_built_in_rust_is_held_to_its_upper_bound() {
    let with_ttl = |ttl_s| EngineConfig {
        name: Some("prefill-0".into()),
        discovery: Some(DiscoveryConfig { etcd: vec!["http://127.0.0.1:2379".into()], prefix: "/o".into(), ttl_s }),
        ..EngineConfig::default()
    };
    assert!(with_ttl(3600).validate().is_ok());
    let said = with_ttl(3601).validate().unwrap_err().to_string();
    assert!(said.contains("discovery.ttl_s") && said.contains("3601 is outside the range 1..=3600"), "{said}");
}

#[test]
fn nvlink_and_mnnvl_are_exclusive() {
    assert!(err(r#"{"nvlink": true, "mnnvl": {}}"#).contains("mutually exclusive"));
    let c = EngineConfig::from_json(r#"{"nvlink": true, "mnnvl": null}"#).unwrap();
    assert!(c.nvlink && c.mnnvl.is_none());
    let c = EngineConfig::from_json(r#"{"mnnvl": {}}"#).unwrap();
    assert_eq!(c.mnnvl, Some(MnnvlConfig::default()));
}

#[test]
fn fabric_domain_parsing() {
    let c = EngineConfig::from_json(r#"{"mnnvl": {"fabric_domain": "000102030405060708090a0b0c0d0e0f"}}"#).unwrap();
    let d = c.mnnvl.unwrap().fabric_domain.fixed().unwrap();
    assert_eq!(d[0], 0);
    assert_eq!(d[15], 15);
    let auto = EngineConfig::from_json(r#"{"mnnvl": {"fabric_domain": "auto"}}"#).unwrap();
    assert_eq!(auto.mnnvl.unwrap().fabric_domain, FabricDomain::Auto);
    let boot = EngineConfig::from_json(r#"{"mnnvl": {"fabric_domain": null}}"#).unwrap().mnnvl.unwrap();
    assert_eq!(boot.fabric_domain, FabricDomain::ThisBoot);
    assert_eq!(EngineConfig::from_json(r#"{"mnnvl": {}}"#).unwrap().mnnvl.unwrap().fabric_domain, FabricDomain::Auto);
    assert!(err(r#"{"mnnvl": {"fabric_domain": "00"}}"#).contains("32 hexadecimal"));
    // 34 digits: refused naming the key, not cut to their first 32 (which
    // may name another, existing domain).
    let long = err(r#"{"mnnvl": {"fabric_domain": "000102030405060708090a0b0c0d0e0f10"}}"#);
    assert!(long.contains("fabric_domain") && long.contains("32 hexadecimal"), "{long}");
    assert!(err(r#"{"mnnvl": {"fabric_domain": "00000000000000000000000000000000"}}"#).contains("all-zero"));
    assert!(err(r#"{"mnnvl": {"fabric_domain": "zz0102030405060708090a0b0c0d0e0f"}}"#).contains("32 hexadecimal"));
    assert!(err(r#"{"mnnvl": {"handle_type": "dmabuf"}}"#).contains("unknown handle type"));
}

#[test]
fn policy_and_listen() {
    assert!(err(r#"{"transport_policy": []}"#).contains("at least one"));
    assert!(err(r#"{"transport_policy": ["tcp", "tcp"]}"#).contains("twice"));
    // Twice anywhere, not only twice in a row (C19 of the third mutant round).
    let m = err(r#"{"transport_policy": ["tcp", "shm", "tcp"]}"#);
    assert!(m.contains("`transport_policy`") && m.contains("\"tcp\" is listed twice"), "{m}");
    assert!(err(r#"{"transport_policy": ["rdma"]}"#).contains("unknown transport"));
    assert!(err(r#"{"listen": "localhost"}"#).contains("`listen`"));
    let c = EngineConfig::from_json(r#"{"transport_policy": ["shm", "tcp"]}"#).unwrap();
    assert_eq!(c.transport_policy, vec![TransportKind::Shm, TransportKind::Tcp]);
}

#[test]
fn security_keys() {
    assert!(err(r#"{"auth_key_file": 7}"#).contains("`auth_key_file`: expected a string"));
    assert!(err(r#"{"auth_key_file": ""}"#).contains("`auth_key_file`: is empty"));
    assert!(err(r#"{"ipc_allowed_uids": [1, -2]}"#).contains("`ipc_allowed_uids`"));
    assert!(err(r#"{"ipc_allowed_uids": 5}"#).contains("expected an array of user ids"));
    assert!(err(r#"{"cma_ptracer": "all"}"#).contains("expected \"peer\", \"any\" or \"none\""));
    assert!(err(r#"{"cma": 1}"#).contains("`cma`"));
    assert!(err(r#"{"offer_timeout_ms": 0}"#).contains("`offer_timeout_ms`"));
    assert!(err(r#"{"max_ipc_channels": 0}"#).contains("`max_ipc_channels`"));
    assert!(err(r#"{"io_threads": 0}"#).contains("`io_threads`"));
    assert!(err(r#"{"io_threads": 65}"#).contains("`io_threads`"));
    assert!(err(r#"{"io_poll_us": 10001}"#).contains("`io_poll_us`"));
    assert!(err(r#"{"wire_security": "encrypt"}"#).contains("`wire_security`: \"encrypt\" needs auth_key_file"));
    assert!(err(r#"{"wire_security": "secret"}"#).contains("`wire_security`: unknown value \"secret\""));
    let c = EngineConfig::from_json(r#"{"auth_key_file": "/k", "wire_security": "encrypt"}"#).unwrap();
    assert_eq!(c.wire_security, crate::control::seal::WireSecurity::Encrypt);
    assert_eq!(EngineConfig::default().wire_security, crate::control::seal::WireSecurity::Integrity);
    let c = EngineConfig::from_json(r#"{"auth_key_file": null, "ipc_allowed_uids": [33]}"#).unwrap();
    assert_eq!((c.auth_key_file, c.ipc_allowed_uids), (None, vec![33]));
}

#[test]
fn names_notifications_and_discovery_are_checked() {
    assert!(err(r#"{"name": ""}"#).contains("`name`"));
    assert!(err(r#"{"name": "a/b"}"#).contains("`name`"));
    assert!(err(r#"{"notification_max_bytes": 0}"#).contains("`notification_max_bytes`"));
    assert!(err(r#"{"notification_max_bytes": 262145}"#).contains("`notification_max_bytes`"));
    assert!(err(r#"{"notification_queue": 65536, "notification_max_bytes": 262144}"#).contains("more than 1 GiB"));
    assert!(err(r#"{"discovery": {"etcd": ["http://h:1"]}}"#).contains("needs `name`"));
    let named = |d: &str| format!(r#"{{"name": "x", "discovery": {d}}}"#);
    assert!(err(&named(r#"{"etcd": []}"#)).contains("`discovery.etcd`"));
    assert!(err(&named(r#"{"etcd": ["h:1"]}"#)).contains("not an http:// URL"));
    assert!(err(&named(r#"{"etcd": "http://h:1"}"#)).contains("expected an array"));
    assert!(err(&named(r#"{"etcd": ["http://h:1"], "prefix": "x"}"#)).contains("`discovery.prefix`"));
    assert!(err(&named(r#"{"etcd": ["http://h:1"], "ttl_s": 0}"#)).contains("`discovery.ttl_s`"));
    let c = EngineConfig::from_json(&named(r#"{"etcd": ["http://h:1"]}"#)).unwrap();
    let d = c.discovery.unwrap();
    assert_eq!((d.prefix.as_str(), d.ttl_s), ("/orbite", 10));
    assert_eq!(EngineConfig::from_json(r#"{"discovery": null}"#).unwrap().discovery, None);
}

#[test]
fn log_level_is_one_of_the_level_names() {
    assert_eq!(EngineConfig::default().log_level, Level::Warn);
    for l in Level::ALL {
        let c = EngineConfig::from_json(&format!(r#"{{"log_level": "{}"}}"#, l.name())).unwrap();
        assert_eq!(c.log_level, l);
        assert_eq!(EngineConfig::from_json(&c.to_json()).unwrap(), c);
    }
    assert!(err(r#"{"log_level": "verbose"}"#).contains("key `log_level`: unknown level \"verbose\""));
    assert!(err(r#"{"log_level": "INFO"}"#).contains("`log_level`"));
    assert!(err(r#"{"log_level": 3}"#).contains("`log_level`: expected a string"));
}

/// 4294967295 is `(uid_t)-1`, no user's id (an unmapped peer shows as
/// the overflow uid): listing it is a config mistake, refused naming the
/// key, while 4294967294 still loads. Guards `parse_uids`'s bound
/// `u32::MAX - 1`.
#[test]
fn ipc_allowed_uids_refuse_the_no_uid_value() {
    let m = err(r#"{"ipc_allowed_uids": [1000, 4294967295]}"#);
    assert!(m.contains("`ipc_allowed_uids`") && m.contains("4294967295"), "{m}");
    let c = EngineConfig::from_json(r#"{"ipc_allowed_uids": [4294967294]}"#).unwrap();
    assert_eq!(c.ipc_allowed_uids, vec![u32::MAX - 1]);
}

/// Companion keys a key's bound needs to stand alone: at its bounds
/// `max_inflight_bytes` (1 MiB) and `max_transfer_bytes` (1 TiB) would
/// otherwise break `max_transfer_bytes <= max_inflight_bytes`.
fn companions(key: &str) -> &'static str {
    match key {
        "max_inflight_bytes" => r#", "max_transfer_bytes": 4096"#,
        "max_transfer_bytes" => r#", "max_inflight_bytes": 1099511627776"#,
        _ => "",
    }
}

/// Every integer key, read from JSON, takes its minimum and its maximum
/// (echoed back exactly) and refuses one below the minimum (where there
/// is one) and one above the maximum, InvalidConfig naming the key, the
/// value and the range. Table-driven over `KEYS`, so each key's range
/// (the docs test holds it to docs/config.md) is probed at its edges,
/// not far from them. Guards `get_u64`'s `n < min || n > max` and
/// `validate`'s `v < min || v > max` at the bound (sweep B: with `<=` or
/// `>=` a documented value is refused).
#[test]
fn every_integer_key_takes_its_bounds_and_refuses_one_past_them() {
    let mut probed = 0;
    for key in KEYS {
        let Some((min, max)) = key.range else { continue };
        let json = |v: u64| format!(r#"{{"{}": {v}{}}}"#, key.name, companions(key.name));
        for v in [min, max] {
            let c = EngineConfig::from_json(&json(v))
                .unwrap_or_else(|e| panic!("`{}` refused its bound {v} ({min}..={max}): {e}", key.name));
            assert_eq!(key.value(&c).as_u64(), Some(v), "`{}` at {v}", key.name);
        }
        let mut past = vec![max + 1];
        if min > 0 {
            past.push(min - 1);
        }
        for v in past {
            let said = err(&json(v));
            let want = format!("key `{}`: {v} is outside the range {min}..={max}", key.name);
            assert_eq!(said, want, "`{}` one past its bound", key.name);
        }
        probed += 1;
    }
    assert_eq!(probed, KEYS.iter().filter(|k| k.range.is_some()).count());
    assert!(probed >= 20, "only {probed} integer keys");
}

/// A config built in Rust is held to each key's upper bound by
/// `validate` too (JSON never gets there: its reader refuses first): one
/// past the maximum of a u64 key and of u32 keys is refused naming the
/// key, the value and its range, and each maximum itself passes. Guards
/// `validate`'s `|| v > max` (sweep B;
/// `a_config_built_in_rust_is_held_to_each_lower_bound` holds `v < min`).
#[test]
fn a_config_built_in_rust_is_held_to_each_upper_bound() {
    let d = EngineConfig::default;
    let t = 1u64 << 40;
    let cases = [
        (
            "max_inflight_bytes",
            EngineConfig { max_inflight_bytes: t, ..d() },
            EngineConfig { max_inflight_bytes: t + 1, ..d() },
        ),
        ("io_threads", EngineConfig { io_threads: 64, ..d() }, EngineConfig { io_threads: 65, ..d() }),
        (
            "notification_max_bytes",
            EngineConfig { notification_max_bytes: 262_144, ..d() },
            EngineConfig { notification_max_bytes: 262_145, ..d() },
        ),
        (
            "ipc_requester_budget_percent",
            EngineConfig { ipc_requester_budget_percent: 100, ..d() },
            EngineConfig { ipc_requester_budget_percent: 101, ..d() },
        ),
    ];
    for (name, at_max, over) in cases {
        let (min, max) = KEYS.iter().find(|k| k.name == name).unwrap().range.unwrap();
        assert!(at_max.validate().is_ok(), "`{name}` at its maximum {max} was refused");
        let said = over.validate().unwrap_err().to_string();
        let want = format!("key `{name}`: {} is outside the range {min}..={max}", max + 1);
        assert!(said.contains(&want), "`{name}` one past its maximum: {said}");
    }
}

/// The notifications a queue may hold are bounded by 1 GiB: a queue of
/// 4096 notifications of 256 KiB (exactly 1 GiB) loads; one notification
/// more is refused naming both keys and the bytes. Guards `validate`'s
/// `held > GIB` (sweep B).
#[test]
fn a_notification_queue_may_hold_exactly_one_gib() {
    let c = EngineConfig::from_json(r#"{"notification_queue": 4096, "notification_max_bytes": 262144}"#).unwrap();
    assert_eq!(c.notification_queue as u64 * c.notification_max_bytes as u64, GIB);
    let said = err(r#"{"notification_queue": 4097, "notification_max_bytes": 262144}"#);
    assert_eq!(
        said,
        "key `notification_queue`: 4097 notifications of up to notification_max_bytes (262144) may hold \
         1074003968 bytes, more than 1 GiB"
    );
}

/// The nested keys at their edges: a discovery prefix of exactly 256
/// bytes loads and one of 257 is refused naming the key; a lease of 3600
/// s loads from JSON and 3601 is refused naming the range; MNNVL's
/// `async_memcpy_threshold` takes 65536 and refuses 65537. Guards
/// `check_discovery`'s `d.prefix.len() > 256` and the ranges given to
/// `get_u32` for `discovery.ttl_s` and `mnnvl.async_memcpy_threshold`
/// (sweep B).
#[test]
fn nested_keys_take_their_bounds_and_refuse_one_past_them() {
    let discovery = |more: &str| format!(r#"{{"name": "x", "discovery": {{"etcd": ["http://h:1"]{more}}}}}"#);
    let prefix = |n: usize| discovery(&format!(r#", "prefix": "/{}""#, "p".repeat(n - 1)));
    let c = EngineConfig::from_json(&prefix(256)).unwrap();
    assert_eq!(c.discovery.unwrap().prefix.len(), 256);
    let said = err(&prefix(257));
    assert!(
        said.starts_with("key `discovery.prefix`: \"/ppp")
            && said.ends_with("\" must start with / and hold at most 256 bytes"),
        "{said}"
    );
    let c = EngineConfig::from_json(&discovery(r#", "ttl_s": 3600"#)).unwrap();
    assert_eq!(c.discovery.unwrap().ttl_s, 3600);
    assert_eq!(err(&discovery(r#", "ttl_s": 3601"#)), "key `discovery.ttl_s`: 3601 is outside the range 1..=3600");
    assert!(EngineConfig::from_json(r#"{"mnnvl": {"async_memcpy_threshold": 65536}}"#).is_ok());
    assert_eq!(
        err(r#"{"mnnvl": {"async_memcpy_threshold": 65537}}"#),
        "key `mnnvl.async_memcpy_threshold`: 65537 is outside the range 0..=65536"
    );
}
