//! The OpenAPI document against what the code serves: every route in
//! [`ROUTES`](super::server::ROUTES) is documented with its method and
//! nothing else is, and every documented object schema names exactly the
//! fields its Rust type reads or writes. A route or field added without
//! its documentation fails here. The host-name patterns admit every name
//! the daemon accepts (a request the document calls invalid must not
//! succeed).

use std::collections::BTreeSet;

use serde::de::{self, DeserializeOwned, Visitor};
use serde_json::Value;

use super::server::ROUTES;
use super::types::*;

fn document() -> Value {
    serde_json::from_str(super::OPENAPI).expect("api/openapi.json is JSON")
}

/// `/v1/sandboxes/{id}/processes/{proc}` and `{pid}` are the same route.
fn normalise(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn every_route_is_documented_and_every_documented_route_is_served() {
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(method, path)| (method.to_string(), normalise(path)))
        .collect();
    let doc = document();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if matches!(
                method.as_str(),
                "get" | "put" | "post" | "delete" | "patch" | "head" | "options"
            ) {
                documented.insert((method.clone(), normalise(path)));
            }
        }
    }
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "served but not in api/openapi.json: {undocumented:?}\nin api/openapi.json but not served: {unserved:?}"
    );
}

/// The field names serde's derive gives a struct: it passes them to
/// `deserialize_struct`, where this deserializer keeps them and stops.
struct FieldCollector<'a>(&'a mut Vec<&'static str>);

impl<'de> de::Deserializer<'de> for FieldCollector<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct with named fields"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.extend_from_slice(fields);
        Err(de::Error::custom("fields collected"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        enum identifier ignored_any
    }
}

fn fields_of<T: DeserializeOwned>() -> BTreeSet<String> {
    let mut fields = Vec::new();
    let _ = T::deserialize(FieldCollector(&mut fields));
    fields.into_iter().map(str::to_string).collect()
}

/// The keys of a serialised sample (for types that are only written).
fn keys_of(sample: impl serde::Serialize) -> BTreeSet<String> {
    match serde_json::to_value(sample).expect("serialise") {
        Value::Object(map) => map.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

fn documented_fields(doc: &Value, schema: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {schema} has no properties in api/openapi.json"))
        .keys()
        .cloned()
        .collect()
}

#[test]
fn every_schema_names_exactly_its_types_fields() {
    let doc = document();
    let sample_image = crate::image::ImageInfo {
        name: String::new(),
        digest: String::new(),
        built: true,
        size_bytes: Some(0),
        source: String::new(),
    };
    let checks: Vec<(&str, BTreeSet<String>)> = vec![
        ("CreateSandbox", fields_of::<CreateSandbox>()),
        ("Sandbox", fields_of::<Sandbox>()),
        ("SandboxList", fields_of::<SandboxList>()),
        ("Limits", fields_of::<Limits>()),
        ("Usage", fields_of::<Usage>()),
        ("SandboxStats", fields_of::<crate::model::SandboxStats>()),
        ("Gpu", fields_of::<Gpu>()),
        ("GpuList", fields_of::<GpuList>()),
        ("SetTtl", fields_of::<SetTtl>()),
        ("StartProcess", fields_of::<StartProcess>()),
        ("AttachRoot", fields_of::<super::types::AttachRoot>()),
        ("RootLimits", fields_of::<crate::model::RootLimits>()),
        ("HostVolume", fields_of::<crate::model::HostVolume>()),
        ("PtySize", fields_of::<PtySize>()),
        ("Process", fields_of::<Process>()),
        ("ProcessList", fields_of::<ProcessList>()),
        ("SendSignal", fields_of::<SendSignal>()),
        ("FileInfo", fields_of::<FileInfo>()),
        ("FileList", fields_of::<FileList>()),
        ("Health", fields_of::<Health>()),
        ("ErrorBody", fields_of::<ErrorBody>()),
        ("ErrorDetail", fields_of::<ErrorDetail>()),
        ("Amount", fields_of::<crate::sandbox::capacity::Amount>()),
        (
            "Capacity",
            fields_of::<crate::sandbox::capacity::Capacity>(),
        ),
        ("Event", fields_of::<crate::sandbox::events::Event>()),
        (
            "NetworkPolicy",
            fields_of::<crate::net::policy::NetworkPolicy>(),
        ),
        ("PolicyView", fields_of::<crate::net::policy::PolicyView>()),
        (
            "EgressLogEntry",
            fields_of::<crate::net::proxy::EgressLogEntry>(),
        ),
        (
            "InterceptedRequest",
            fields_of::<crate::net::proxy::LoggedRequest>(),
        ),
        ("Snapshot", fields_of::<crate::sandbox::SnapshotView>()),
        (
            "TakeSnapshot",
            fields_of::<super::snapshots::TakeSnapshot>(),
        ),
        ("Image", keys_of(sample_image)),
        ("PulledImage", fields_of::<crate::image::oci::PulledImage>()),
        ("ImageSpec", fields_of::<crate::image::built::ImageSpec>()),
        ("BuiltImage", fields_of::<crate::image::built::BuiltImage>()),
        ("CreateSecret", fields_of::<CreateSecret>()),
        ("RotateSecret", fields_of::<RotateSecret>()),
        ("Secret", fields_of::<Secret>()),
        ("SecretList", fields_of::<SecretList>()),
        ("ExposePort", fields_of::<super::types::ExposePort>()),
        ("PortUrl", fields_of::<super::types::PortUrl>()),
        ("PortList", fields_of::<super::types::PortList>()),
        ("ListeningPort", fields_of::<super::types::ListeningPort>()),
    ];
    let mut wrong = Vec::new();
    for (schema, fields) in &checks {
        assert!(!fields.is_empty(), "no fields collected for {schema}");
        let documented = documented_fields(&doc, schema);
        let missing: Vec<_> = fields.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(fields).collect();
        if !missing.is_empty() || !extra.is_empty() {
            wrong.push(format!(
                "{schema}: undocumented {missing:?}, documented but absent {extra:?}"
            ));
        }
    }
    // Every object schema with properties is checked here, so a new one
    // cannot slip by.
    let checked: BTreeSet<&str> = checks.iter().map(|(s, _)| *s).collect();
    for (name, schema) in doc["components"]["schemas"].as_object().expect("schemas") {
        if schema.get("properties").is_some()
            && !checked.contains(name.as_str())
            && !name.starts_with("OutputEvent")
        {
            wrong.push(format!("{name}: no Rust type is checked against it"));
        }
    }
    assert!(
        wrong.is_empty(),
        "api/openapi.json drifted:\n{}",
        wrong.join("\n")
    );
}

/// The `pattern` at `pointer` in the document, compiled as JSON Schema's
/// ECMA-262 regexes read it (no implicit anchoring; these are anchored).
fn pattern_at(doc: &Value, pointer: &str) -> regex::Regex {
    let pattern = doc
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no pattern at {pointer}"));
    regex::Regex::new(pattern).unwrap_or_else(|e| panic!("{pointer}: {e}"))
}

#[test]
fn host_name_patterns_admit_every_name_the_daemon_accepts() {
    let doc = document();
    let patterns: Vec<(&str, regex::Regex)> = [
        "/components/schemas/NetworkPolicy/properties/allow_list/items/anyOf/0/pattern",
        "/components/schemas/CreateSandbox/properties/allow_list/items/anyOf/0/pattern",
        "/components/schemas/CreateSecret/properties/hosts/items/pattern",
    ]
    .into_iter()
    .map(|pointer| (pointer, pattern_at(&doc, pointer)))
    .collect();
    let names = [
        "example.com",
        "Example.COM",
        "x.1com",
        "_acme.x.test",
        "a-b.c",
        "xn--bcher-kva.de",
        "bücher.de",
        "BÜCHER.de",
        "ｅｘａｍｐｌｅ。ｃｏｍ",
        "*.bücher.de",
        "*.example.com",
    ];
    for name in names {
        let entry = crate::net::policy::parse_entry(name);
        assert!(entry.is_ok(), "{name}: {entry:?}");
        let bound = crate::secrets::spec::validate_hosts(&[name], true);
        assert!(bound.is_ok(), "{name}: {bound:?}");
        for (pointer, pattern) in &patterns {
            assert!(pattern.is_match(name), "{pointer} refuses {name}");
        }
    }
    // The control: what the daemon refuses, the patterns refuse too.
    for name in ["a..b", "-a.com", "a.b-", "a b", "*.com", "*.bücher"] {
        assert!(crate::net::policy::parse_entry(name).is_err(), "{name}");
        assert!(
            crate::secrets::spec::validate_hosts(&[name], true).is_err(),
            "{name}"
        );
        for (pointer, pattern) in &patterns {
            assert!(!pattern.is_match(name), "{pointer} admits {name}");
        }
    }
}
