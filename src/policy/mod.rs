//! Who may call what: per-Partner (and per-method) allow and deny lists of AIC patterns,
//! the `senderRole` rule, the block list, and task ownership ([`tasks`]).
//!
//! Everything here is compiled from the config at load; a check is a few hash lookups
//! (access rules: [`access`]) or comparisons against short lists and allocates nothing. Every refusal is `-32009` with a reason,
//! except a blocked AIC, whose credential counts as revoked (`-32010`).

pub(crate) mod a2a;
pub(crate) mod access;
mod owner_ids;
pub(crate) mod pattern;
pub(crate) mod tasks;

use std::collections::HashSet;

use crate::error::GatewayError;
use crate::identity::{Aic, AicFields, CredentialError, PeerIdentity};
use crate::jsonrpc::Method;
pub(crate) use access::AccessMatcher;
pub(crate) use pattern::AicPattern;

/// An allow list and a deny list, as configured. Deny wins; a non-empty allow list
/// refuses everyone else. Checked through its compiled form ([`AccessRule::compile`]).
#[derive(Debug, Clone, Default)]
pub struct AccessRule {
    /// Who may (empty: everyone not denied).
    pub allow: Vec<AicPattern>,
    /// Who may not.
    pub deny: Vec<AicPattern>,
}

impl AccessRule {
    /// The lists compiled into sets of AIC prefixes (see [`access`]).
    pub(crate) fn compile(&self) -> AccessMatcher {
        AccessMatcher::new(&self.allow, &self.deny)
    }

    /// The decision pattern by pattern, as it was made before the lists were compiled:
    /// the oracle the compiled matcher is tested against.
    #[cfg(test)]
    pub(crate) fn decide_linear(&self, aic: &Aic) -> Result<(), &'static str> {
        if self.deny.iter().any(|p| p.matches(aic)) {
            return Err("aic_denied");
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|p| p.matches(aic)) {
            return Err("aic_not_allowed");
        }
        Ok(())
    }
}

/// A Partner's access rules, compiled at load: one for every method, and extra ones for
/// some methods. A clone shares the compiled lists.
#[derive(Debug, Clone, Default)]
pub struct PartnerAccess {
    /// Applies to every method.
    base: AccessMatcher,
    /// Apply, in addition, to the methods marked (indexed by `Method::index`).
    methods: Vec<([bool; Method::ALL.len()], AccessMatcher)>,
}

impl PartnerAccess {
    /// Compiles the rule for every method and the per-method ones.
    pub fn new(base: &AccessRule, methods: &[([bool; Method::ALL.len()], AccessRule)]) -> Self {
        PartnerAccess {
            base: base.compile(),
            methods: methods.iter().map(|(s, r)| (*s, r.compile())).collect(),
        }
    }

    /// Checks a verified caller (its AIC's fields found once per connection) against the
    /// Partner's rules for a method.
    pub fn check_peer(
        &self,
        peer: &PeerIdentity,
        method: Method,
        partner: &str,
    ) -> Result<(), GatewayError> {
        self.check_fields(&peer.aic, &peer.fields, method, partner)
    }

    /// Checks a verified caller against the rule for every method alone, for `method`
    /// (an A2A Partner's: it has no per-method rules, they name AIP methods and are
    /// refused at load; or what is no method: the GET of an A2A agent card).
    pub fn check_base(
        &self,
        peer: &PeerIdentity,
        method: &str,
        partner: &str,
    ) -> Result<(), GatewayError> {
        self.base
            .decide_fields(&peer.aic, &peer.fields)
            .map_err(|reason| GatewayError::Forbidden {
                reason,
                detail: format!("{} may not call {method} at Partner {partner}", peer.aic),
            })
    }

    /// Checks an AIC against the Partner's rules for a method.
    pub fn check(&self, aic: &Aic, method: Method, partner: &str) -> Result<(), GatewayError> {
        self.check_fields(aic, &AicFields::of(aic), method, partner)
    }

    fn check_fields(
        &self,
        aic: &Aic,
        fields: &AicFields,
        method: Method,
        partner: &str,
    ) -> Result<(), GatewayError> {
        let refuse = |reason: &'static str| GatewayError::Forbidden {
            reason,
            detail: format!("{aic} may not call {} at Partner {partner}", method.name()),
        };
        self.base.decide_fields(aic, fields).map_err(refuse)?;
        for (set, rule) in &self.methods {
            if set[method.index()] {
                rule.decide_fields(aic, fields).map_err(refuse)?;
            }
        }
        Ok(())
    }
}

/// Parses a method pattern list (`rpc`, `notification/*`, `*`) into a method set.
pub(crate) fn method_set(names: &[String]) -> Result<[bool; Method::ALL.len()], String> {
    let mut set = [false; Method::ALL.len()];
    for n in names {
        let mut hit = false;
        for m in Method::ALL {
            let matches = match n.strip_suffix('*') {
                Some(prefix) => m.name().starts_with(prefix),
                None => m.name() == n,
            };
            if matches {
                set[m.index()] = true;
                hit = true;
            }
        }
        if !hit {
            return Err(format!("{n:?} names no AIP method"));
        }
    }
    Ok(set)
}

/// Gateway-wide rules.
#[derive(Debug, Clone)]
pub struct GlobalPolicy {
    /// Accepted `params.message.senderRole` values (empty: any).
    pub sender_roles: Vec<String>,
    /// AICs refused outright, as if their certificates were revoked.
    pub blocked: HashSet<Aic, ahash::RandomState>,
}

impl GlobalPolicy {
    /// A blocked AIC is an invalid credential (`-32010`).
    pub fn check_blocked(&self, aic: &Aic) -> Result<(), GatewayError> {
        if !self.blocked.is_empty() && self.blocked.contains(aic) {
            return Err(GatewayError::InvalidCredential(CredentialError::Blocked));
        }
        Ok(())
    }

    /// Requests through the gateway come from Leaders.
    pub fn check_role(&self, role: Option<&str>) -> Result<(), GatewayError> {
        match role {
            Some(r)
                if !self.sender_roles.is_empty() && !self.sender_roles.iter().any(|x| x == r) =>
            {
                Err(GatewayError::Forbidden {
                    reason: "sender_role",
                    detail: format!("senderRole {r:?} may not call through this gateway"),
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> AicPattern {
        s.parse().unwrap()
    }

    #[test]
    fn deny_wins_and_allow_lists_are_closed() {
        let a = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
        let b = Aic::parse("10001000011K94ZH3VDXLP4S5EB63614").unwrap();
        let rule = AccessRule {
            allow: vec![p("10001*")],
            deny: vec![p("10001000011K912345E789ABCDEF2353")],
        }
        .compile();
        assert_eq!(rule.decide(&a), Err("aic_denied"));
        assert_eq!(rule.decide(&b), Ok(()));
        let only_b = AccessRule {
            allow: vec![p("10001000011K94ZH3VDXLP4S5EB63614")],
            deny: vec![],
        }
        .compile();
        assert_eq!(only_b.decide(&a), Err("aic_not_allowed"));
        assert_eq!(AccessRule::default().compile().decide(&a), Ok(()));
    }

    #[test]
    fn method_sets() {
        let s = method_set(&["notification/*".into(), "group".into()]).unwrap();
        assert!(s[Method::NotificationGet.index()] && s[Method::Group.index()]);
        assert!(!s[Method::Rpc.index()]);
        assert!(method_set(&["fly".into()]).is_err());
        assert!(method_set(&["*".into()]).unwrap().iter().all(|x| *x));
    }
}
