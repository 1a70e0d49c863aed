//! A config's text cut at its `[[partner]]` tables, so that each Partner is parsed as a
//! small document of its own.
//!
//! Why not `toml::from_str` on the whole text: the TOML reader builds the whole document
//! before serde reads it, and walking a 10,000-Partner document is not linear (measured
//! with toml 0.9: 10,000 Partners parse in 27x the time of 1,000; the same tables parsed
//! one by one, 10x). A reload of a large fleet is mostly this parse.
//!
//! The cut is made on the TOML lexer's tokens (strings, comments and multi-line arrays
//! are tokens or nesting, never mistaken for a header). Anything the cut does not fully
//! understand makes it give up, and the whole text is parsed as before: quoted or
//! unusual keys in a header, a `partner` key outside `[[partner]]` headers, a sub-table
//! of `partner` outside a Partner. The result is checked by `tests` against the whole
//! parse; any error is reported by the whole parse, with its line and column.

use toml_parser::lexer::TokenKind;

/// A config's text in parts: everything but the Partners, and one text per Partner.
pub(crate) struct Parts<'a> {
    /// The text without its `[[partner]]` tables (their headers and sub-tables included).
    pub rest: String,
    /// Each `[[partner]]` table with its sub-tables, in file order.
    pub partners: Vec<&'a str>,
}

/// What the text being read belongs to.
#[derive(Clone, Copy, PartialEq)]
enum Region {
    /// Before any header: root keys.
    Root,
    /// A table that is not a Partner's.
    Other,
    /// A `[[partner]]` table or one of its sub-tables.
    Partner,
}

/// Cuts `text` at its `[[partner]]` tables; `None` when it cannot be sure of the cut
/// (the caller then parses the whole text).
pub(crate) fn split(text: &str) -> Option<Parts<'_>> {
    // The tokens are read as they are lexed, not collected: a 10,000-Partner file would
    // make megabytes of them.
    let mut tokens = toml_parser::Source::new(text).lex().peekable();
    let mut parts = Parts {
        rest: String::with_capacity(1024),
        partners: Vec::new(),
    };
    let mut region = Region::Root;
    let mut start = 0; // where the current region's text starts
    let mut depth = 0usize; // open `[` and `{` of values
    let mut line_start = true;
    while let Some(t) = tokens.next() {
        match t.kind() {
            TokenKind::Whitespace | TokenKind::Comment => {}
            TokenKind::Newline => line_start = depth == 0,
            TokenKind::Eof => break,
            TokenKind::LeftSquareBracket if line_start && depth == 0 => {
                let header = header(text, &mut tokens)?;
                let here = t.span().start();
                let now = match (header.array, header.keys.as_slice()) {
                    (true, ["partner"]) => Region::Partner,
                    (_, ["partner", ..]) if header.keys.len() > 1 => {
                        if region != Region::Partner {
                            return None;
                        }
                        Region::Partner
                    }
                    (_, ["partner"]) => return None,
                    _ => Region::Other,
                };
                // A new Partner, or a move between a Partner and the rest, ends a part.
                let new_partner = header.array && header.keys.len() == 1 && now == Region::Partner;
                if new_partner || now != region {
                    close(&mut parts, text, region, start, here);
                    start = here;
                }
                region = now;
                line_start = false;
            }
            kind => {
                if line_start
                    && depth == 0
                    && region == Region::Root
                    && !bare_key_not_partner(text, &t)
                {
                    return None;
                }
                match kind {
                    TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
                    TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => {
                        depth = depth.checked_sub(1)?;
                    }
                    _ => {}
                }
                line_start = false;
            }
        }
    }
    close(&mut parts, text, region, start, text.len());
    Some(parts)
}

/// Ends the part `text[start..end]` of `region`.
fn close<'a>(parts: &mut Parts<'a>, text: &'a str, region: Region, start: usize, end: usize) {
    let part = &text[start..end];
    match region {
        Region::Partner => parts.partners.push(part),
        Region::Root | Region::Other => {
            parts.rest.push_str(part);
            // The next part starts on a line of its own.
            if !part.is_empty() && !part.ends_with('\n') {
                parts.rest.push('\n');
            }
        }
    }
}

/// A root key that is a bare key other than `partner` (a quoted key could spell it).
fn bare_key_not_partner(text: &str, t: &toml_parser::lexer::Token) -> bool {
    let s = t.span();
    t.kind() == TokenKind::Atom && &text[s.start()..s.end()] != "partner"
}

/// A table header: its bare keys, and whether it is an array table.
struct Header<'a> {
    array: bool,
    keys: Vec<&'a str>,
}

/// Reads the rest of a header whose first `[` was just read; `None` for anything but
/// bare keys joined by dots.
fn header<'a>(
    text: &'a str,
    tokens: &mut std::iter::Peekable<toml_parser::lexer::Lexer<'_>>,
) -> Option<Header<'a>> {
    let array = tokens
        .next_if(|t| t.kind() == TokenKind::LeftSquareBracket)
        .is_some();
    let mut keys = Vec::new();
    let mut want_key = true;
    loop {
        let t = tokens.next()?;
        match t.kind() {
            TokenKind::Whitespace => {}
            TokenKind::Atom if want_key => {
                let s = t.span();
                keys.push(&text[s.start()..s.end()]);
                want_key = false;
            }
            TokenKind::Dot if !want_key => want_key = true,
            TokenKind::RightSquareBracket if !want_key => break,
            _ => return None,
        }
    }
    if array && tokens.next()?.kind() != TokenKind::RightSquareBracket {
        return None;
    }
    // An atom holding a dot (`a.b` lexed as one) is not a bare key: give up.
    if keys.iter().any(|k| k.contains('.')) {
        return None;
    }
    Some(Header { array, keys })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::RawConfig;

    fn whole(text: &str) -> String {
        format!("{:?}", toml::from_str::<RawConfig>(text).unwrap())
    }

    fn by_parts(text: &str) -> String {
        let parts = split(text).expect("split");
        let mut raw: RawConfig = toml::from_str(&parts.rest).unwrap();
        assert!(raw.partners.is_empty());
        for p in parts.partners {
            raw.partners.extend(crate::config::one_partner(p).unwrap());
        }
        format!("{raw:?}")
    }

    const LISTENER: &str = "[listener]\nbind = \"127.0.0.1:0\"\ncert = \"g.pem\"\nkey = \"g.key\"\nclient_ca = [\"ca.pem\"]\n";

    fn partner(i: usize, extra: &str) -> String {
        format!("[[partner]]\nname = \"p{i}\"\nprefix = \"/p{i}\"\nupstreams = [\"http://127.0.0.1:9000\"]\n{extra}")
    }

    #[test]
    fn the_parts_read_as_the_whole() {
        let subtables = "[partner.limits]\nmax_in_flight = 3\nrate = 10.0\n[partner.access]\nallow = [\"a\"]\n[[partner.access.methods]]\nmethods = [\"rpc\"]\ndeny = [\"b\"]\n[partner.paths]\nrpc = \"/x\"\n";
        let cases = [
            format!("{LISTENER}{}{}", partner(0, ""), partner(1, subtables)),
            // Tables after and between Partners, and root keys first.
            format!("[log]\nlevel = \"debug\"\n{}[reload]\nwatch = false\n{}{LISTENER}{}[runtime]\nworker_threads = 1", partner(0, subtables), partner(1, ""), partner(2, "")),
            // Headers inside strings, comments and multi-line arrays are not headers.
            format!("{LISTENER}{}", partner(0, "hosts = [\n  \"a\", # [[partner]]\n  \"b\",\n]\n[partner.access]\nallow = [\n\"x\",\n]\n# [ratelimit]\n")),
            format!("{LISTENER}[[partner]]\nname = \"\"\"\n[[partner]]\nname = 'q'\n\"\"\"\nprefix = '''\n[listener]\n'''\nupstreams = [\"http://h:1\"]\n"),
            // Spaces around dots and in brackets, CRLF line ends, no trailing newline.
            format!("{LISTENER}[[ partner ]]\r\nname = \"p\"\r\nprefix = \"/p\"\r\nupstreams = [\"http://h:1\"]\r\n[ partner . limits ]\r\nrate = 1.0"),
            // No Partners at all.
            LISTENER.to_owned(),
        ];
        for text in &cases {
            assert_eq!(by_parts(text), whole(text), "{text}");
        }
        let fleet: String = (0..300)
            .map(|i| partner(i, if i % 3 == 0 { subtables } else { "" }))
            .collect();
        let text = format!("{LISTENER}{fleet}");
        assert_eq!(split(&text).unwrap().partners.len(), 300);
        assert_eq!(by_parts(&text), whole(&text));
    }

    #[test]
    fn what_it_cannot_be_sure_of_is_left_to_the_whole_parse() {
        for text in [
            format!("partner = [{{ name = \"p\" }}]\n{LISTENER}"),
            format!("\"partner\" = []\n{LISTENER}"),
            format!("{LISTENER}[[\"partner\"]]\nname = \"p\"\n"),
            format!("{LISTENER}[partner.limits]\nrate = 1.0\n"),
            format!("{LISTENER}[partner]\nname = \"p\"\n"),
            format!("{LISTENER}{}[[partner.'x y']]\n", partner(0, "")),
        ] {
            assert!(split(&text).is_none(), "{text}");
        }
    }

    #[test]
    fn the_committed_configs_read_the_same_by_parts() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                if toml::from_str::<RawConfig>(&text).is_ok() && split(&text).is_some() {
                    assert_eq!(by_parts(&text), whole(&text), "{}", path.display());
                    seen += 1;
                }
            }
        }
        assert!(seen > 0);
    }
}
