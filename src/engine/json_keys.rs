//! Duplicate keys in a JSON document: serde_json keeps the last of them
//! silently, so a config naming a key twice would run with whichever came
//! last. This walks the document once (serde's visitor, no second parser)
//! and names the first key an object repeats, with its path.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The first key repeated within one object of `text`, as a path
/// (`discovery.prefix`); `None` when every object's keys are distinct or
/// the text is not JSON (the parser proper reports that).
pub fn first_duplicate(text: &str) -> Option<String> {
    let mut d = serde_json::Deserializer::from_str(text);
    let found: Result<Option<String>, _> = (Walk { path: String::new() }).deserialize(&mut d);
    found.unwrap_or_default()
}

/// Walks one value at `path`; yields the first duplicate found in it.
struct Walk {
    path: String,
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Walk {
    fn child(&self, key: &str) -> Walk {
        Walk { path: if self.path.is_empty() { key.to_string() } else { format!("{}.{key}", self.path) } }
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut i = 0usize;
        while let Some(f) = seq.next_element_seed(self.child(&i.to_string()))? {
            found = found.or(f);
            i += 1;
        }
        Ok(found)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            let inner = map.next_value_seed(self.child(&key))?;
            if found.is_none() && !seen.insert(key.clone()) {
                found = Some(self.child(&key).path);
            }
            found = found.or(inner);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::first_duplicate;

    #[test]
    fn repeated_keys_are_named_with_their_path() {
        assert_eq!(first_duplicate(r#"{"a": 1, "b": {"c": 2}, "d": [{"e": 1}]}"#), None);
        assert_eq!(first_duplicate(r#"{"io_threads": 1, "io_threads": 4}"#).as_deref(), Some("io_threads"));
        assert_eq!(
            first_duplicate(r#"{"discovery": {"prefix": "/a", "ttl_s": 3, "prefix": "/b"}}"#).as_deref(),
            Some("discovery.prefix")
        );
        assert_eq!(first_duplicate(r#"{"x": [{"k": 1, "k": 2}]}"#).as_deref(), Some("x.0.k"));
        // The same key in different objects is no repeat.
        assert_eq!(first_duplicate(r#"{"a": {"k": 1}, "b": {"k": 2}}"#), None);
        assert_eq!(first_duplicate("{not json"), None);
    }
}
