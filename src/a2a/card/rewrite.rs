//! An unsigned agent card made the gateway's: its JSON-RPC endpoints point at the
//! gateway's URL for the route, the endpoints of other bindings (gRPC, HTTP+JSON, which
//! the gateway does not front) are dropped rather than left pointing past it, and mutual
//! TLS is declared as a security scheme ANDed into every security requirement, in the
//! shape of each card generation present:
//! - 1.0 (`supportedInterfaces`): `securitySchemes.<name>.mtlsSecurityScheme` and
//!   `securityRequirements[].schemes.<name> = {"list": []}`;
//! - 0.3 (`url`, `additionalInterfaces`, `preferredTransport`, or no `supportedInterfaces`):
//!   `securitySchemes.<name> = {"type": "mutualTLS", ...}` and `security[].<name> = []`.
//!
//! A card carrying both (as the Python SDK's serves for 0.3 clients) gets both, merged in
//! one scheme object as that SDK writes it. Links that are not endpoints
//! (`documentationUrl`, `iconUrl`, `provider.url`) are left as they are.

use serde_json::{json, Map, Value};

/// The security scheme's name in the served card.
pub(crate) const SCHEME: &str = "aipgwMutualTls";

const DESCRIPTION: &str = "Mutual TLS at the aipgw gateway: a client certificate carrying \
                           the caller's AIC (Agent Identity Code)";

const JSONRPC: &str = "JSONRPC";

/// Rewrites `card` for the gateway's URL `base`.
pub(crate) fn rewrite(card: &mut Value, base: &str) {
    let Some(card) = card.as_object_mut() else {
        return;
    };
    let v1 = card.contains_key("supportedInterfaces");
    let v03 = !v1
        || ["url", "additionalInterfaces", "preferredTransport"]
            .iter()
            .any(|k| card.contains_key(*k));
    endpoints(card, "supportedInterfaces", "protocolBinding", base);
    endpoints(card, "additionalInterfaces", "transport", base);
    if card.contains_key("url") {
        card.insert("url".into(), Value::from(base));
    }
    if card.contains_key("preferredTransport") {
        card.insert("preferredTransport".into(), Value::from(JSONRPC));
    }
    declare_mtls(card, v1, v03);
}

/// The JSON-RPC interfaces in `card[key]` pointed at `base`; the others dropped.
fn endpoints(card: &mut Map<String, Value>, key: &str, binding: &str, base: &str) {
    let Some(Value::Array(list)) = card.get_mut(key) else {
        return;
    };
    list.retain(|i| {
        i.get(binding)
            .and_then(Value::as_str)
            .is_some_and(|b| b.eq_ignore_ascii_case(JSONRPC))
    });
    for i in list.iter_mut().filter_map(Value::as_object_mut) {
        i.insert("url".into(), Value::from(base));
    }
}

/// Mutual TLS as a scheme, required (ANDed) in every alternative the agent lists.
fn declare_mtls(card: &mut Map<String, Value>, v1: bool, v03: bool) {
    let schemes = card
        .entry("securitySchemes")
        .or_insert_with(|| Value::Object(Map::new()));
    if !schemes.is_object() {
        *schemes = Value::Object(Map::new());
    }
    let mut scheme = Map::new();
    if v1 {
        scheme.insert(
            "mtlsSecurityScheme".into(),
            json!({ "description": DESCRIPTION }),
        );
    }
    if v03 {
        scheme.insert("type".into(), Value::from("mutualTLS"));
        scheme.insert("description".into(), Value::from(DESCRIPTION));
    }
    if let Some(s) = schemes.as_object_mut() {
        s.insert(SCHEME.into(), Value::Object(scheme));
    }
    if v1 {
        for r in requirements(card, "securityRequirements") {
            let schemes = r
                .entry("schemes")
                .or_insert_with(|| Value::Object(Map::new()));
            if !schemes.is_object() {
                *schemes = Value::Object(Map::new());
            }
            if let Some(s) = schemes.as_object_mut() {
                s.insert(SCHEME.into(), json!({ "list": [] }));
            }
        }
    }
    if v03 {
        for r in requirements(card, "security") {
            r.insert(SCHEME.into(), json!([]));
        }
    }
}

/// The requirement objects of `card[key]` (one empty one made when there are none).
fn requirements<'a>(
    card: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    let list = card.entry(key).or_insert_with(|| json!([]));
    let empty = list.as_array().is_none_or(Vec::is_empty);
    if empty {
        *list = json!([{}]);
    }
    list.as_array_mut()
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "https://gw.example/a2a/agent";

    #[test]
    fn a_1_0_card_points_at_the_gateway_and_requires_mtls() {
        let mut card = json!({
            "name": "a", "documentationUrl": "https://agent.example/docs",
            "supportedInterfaces": [
                {"url": "http://10.0.0.5:9999/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": "10.0.0.5:50051", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "http://10.0.0.5:9999/", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}
            ],
            "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}},
            "securityRequirements": [{"schemes": {"bearer": {"list": []}}}]
        });
        rewrite(&mut card, BASE);
        let ifaces = card["supportedInterfaces"].as_array().unwrap();
        assert_eq!(ifaces.len(), 2);
        assert!(ifaces.iter().all(|i| i["url"] == BASE));
        assert_eq!(card["documentationUrl"], "https://agent.example/docs");
        assert!(card["securitySchemes"][SCHEME]["mtlsSecurityScheme"].is_object());
        assert!(card["securitySchemes"][SCHEME].get("type").is_none());
        assert_eq!(
            card["securityRequirements"],
            json!([{"schemes": {"bearer": {"list": []}, SCHEME: {"list": []}}}])
        );
        assert!(card.get("security").is_none());
    }

    #[test]
    fn a_0_3_card_gets_the_0_3_shapes() {
        let mut card = json!({
            "name": "a", "url": "http://127.0.0.1:9999/", "preferredTransport": "GRPC",
            "additionalInterfaces": [
                {"url": "http://127.0.0.1:9999/", "transport": "JSONRPC"},
                {"url": "127.0.0.1:50051", "transport": "GRPC"}
            ]
        });
        rewrite(&mut card, BASE);
        assert_eq!(card["url"], BASE);
        assert_eq!(card["preferredTransport"], "JSONRPC");
        assert_eq!(
            card["additionalInterfaces"],
            json!([{"url": BASE, "transport": "JSONRPC"}])
        );
        assert_eq!(card["securitySchemes"][SCHEME]["type"], "mutualTLS");
        assert_eq!(card["security"], json!([{SCHEME: []}]));
        assert!(card.get("securityRequirements").is_none());
    }

    #[test]
    fn a_card_of_both_generations_gets_both() {
        let mut card = json!({
            "url": "http://127.0.0.1:1/", "protocolVersion": "0.3.0",
            "supportedInterfaces": [{"url": "http://127.0.0.1:1/", "protocolBinding": "JSONRPC"}],
            "security": [{"k": []}, {"j": []}]
        });
        rewrite(&mut card, BASE);
        let scheme = &card["securitySchemes"][SCHEME];
        assert!(scheme["mtlsSecurityScheme"].is_object());
        assert_eq!(scheme["type"], "mutualTLS");
        assert_eq!(
            card["security"],
            json!([{"k": [], SCHEME: []}, {"j": [], SCHEME: []}])
        );
        assert_eq!(
            card["securityRequirements"],
            json!([{"schemes": {SCHEME: {"list": []}}}])
        );
    }
}
