//! The route index: Partners by the key of their route (path prefix, then host), built
//! once per config load. A lookup tries the few prefixes a path can have (the path
//! itself, then the path less a method name), longest first, one hash lookup each, so
//! its cost does not grow with the number of Partners.

use std::collections::HashMap;

use crate::jsonrpc::Method;

/// Partners that share a prefix: the one for any host, and those for named hosts.
#[derive(Default)]
struct Slot {
    /// The host-agnostic Partner (an index into the table's Partners).
    any: Option<usize>,
    /// Host (lowercase) -> Partner.
    hosts: HashMap<Box<str>, usize, ahash::RandomState>,
}

/// Prefix (without its trailing `/`: the root prefix `/` is the empty key) -> its Partners.
#[derive(Default)]
pub(super) struct RouteIndex {
    prefixes: HashMap<Box<str>, Slot, ahash::RandomState>,
    /// `lengths[n]`: some prefix key is `n` bytes long (a candidate of a length no
    /// prefix has is not looked up).
    lengths: Vec<bool>,
    /// Every method, the shortest name first: the longest prefix a path can have less a
    /// method name comes first.
    methods: Vec<Method>,
}

impl RouteIndex {
    /// An empty index with room for `n` prefixes (no rehash while a fleet is loaded).
    pub(super) fn with_capacity(n: usize) -> RouteIndex {
        RouteIndex {
            prefixes: HashMap::with_capacity_and_hasher(n, Default::default()),
            ..RouteIndex::default()
        }
    }

    /// Adds a Partner's routes (prefix, hosts) unless another Partner added earlier has
    /// them (the configuration refuses two Partners on one route).
    pub(super) fn insert(&mut self, prefix: &str, hosts: &[String], partner: usize) {
        let key = if prefix == "/" { "" } else { prefix };
        if self.lengths.len() <= key.len() {
            self.lengths.resize(key.len() + 1, false);
        }
        self.lengths[key.len()] = true;
        let slot = self.prefixes.entry(key.into()).or_default();
        if hosts.is_empty() {
            slot.any.get_or_insert(partner);
        }
        for h in hosts {
            slot.hosts.entry(h.as_str().into()).or_insert(partner);
        }
    }

    /// Finishes the index once every Partner is in.
    pub(super) fn build(mut self) -> RouteIndex {
        self.methods = Method::ALL.to_vec();
        self.methods.sort_by_key(|m| m.name().len());
        self.prefixes.shrink_to_fit();
        self
    }

    /// The Partner (its index) and the method the path names for a host (lowercase, no
    /// port) and path: at `<prefix>` or `<prefix>/` the body decides, `<prefix>/<method>`
    /// names it; the longest prefix with a Partner for the host (or for any host) wins.
    pub(super) fn find(&self, host: Option<&str>, path: &str) -> Option<(usize, Option<Method>)> {
        if !path.starts_with('/') {
            return None;
        }
        // The bare prefix: the path itself (never the root, whose key is empty), then the
        // path less one trailing slash.
        if let Some(p) = self.partner(path, host) {
            return Some((p, None));
        }
        if let Some(p) = path.strip_suffix('/').and_then(|k| self.partner(k, host)) {
            return Some((p, None));
        }
        for &m in &self.methods {
            let Some(key) = path
                .strip_suffix(m.name())
                .and_then(|rest| rest.strip_suffix('/'))
            else {
                continue;
            };
            if let Some(p) = self.partner(key, host) {
                return Some((p, Some(m)));
            }
        }
        None
    }

    /// The Partner at this prefix key for the host: host-specific first.
    fn partner(&self, key: &str, host: Option<&str>) -> Option<usize> {
        if !self.lengths.get(key.len()).copied().unwrap_or(false) {
            return None;
        }
        let slot = self.prefixes.get(key)?;
        let named = match host {
            Some(h) if !slot.hosts.is_empty() => slot.hosts.get(h).copied(),
            _ => None,
        };
        named.or(slot.any)
    }
}
