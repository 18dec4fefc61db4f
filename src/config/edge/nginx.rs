//! nginx: `limit_req_zone` / `limit_req` per rule, `limit_req_status 429`, and the
//! `real_ip` settings that make nginx see the client the origin's `[key]` sees.

use std::collections::BTreeMap;

use super::resolve::{EdgeRule, Key, PathMatch};
use super::{EdgeTarget, ExportOptions};
use crate::config::{KeyConfig, KeyKind, Plan};
use crate::error::ConfigError;

const TARGET: EdgeTarget = EdgeTarget::Nginx;

/// `rate=` in nginx's units (integer requests per second or per minute) and its size in
/// requests per millisecond as (count, per_ms).
fn rate(
    rule: &EdgeRule,
    round_stricter: bool,
    notes: &mut Vec<String>,
) -> Result<(String, u64, u64), ConfigError> {
    let n = u128::from(rule.limit);
    let w = u128::from(rule.window_ms);
    let narrow = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    if (n * 1000).is_multiple_of(w) {
        let per_s = narrow(n * 1000 / w);
        return Ok((format!("{per_s}r/s"), per_s, 1000));
    }
    if (n * 60_000).is_multiple_of(w) {
        let per_m = narrow(n * 60_000 / w);
        return Ok((format!("{per_m}r/m"), per_m, 60_000));
    }
    let per_m = narrow(n * 60_000 / w);
    let refusal = rule.refuse(
        "window",
        format_args!("{:?}", rule.window_text),
        TARGET,
        format!(
            "rates are whole requests per second or per minute (r/s, r/m), and {} per {} is {}.{:03} per minute",
            rule.limit,
            rule.window_text,
            per_m,
            narrow((n * 60_000_000 / w) % 1000)
        ),
    );
    if per_m == 0 {
        return Err(ConfigError::new(
            refusal.field(),
            refusal.value(),
            format!("{}; nginx's slowest rate is 1r/m", refusal.reason()),
        ));
    }
    rule.stricter_or_refuse(
        round_stricter,
        notes,
        refusal,
        format!("rate rounded down to {per_m}r/m"),
    )?;
    Ok((format!("{per_m}r/m"), per_m, 60_000))
}

/// The `limit_req` parameters: `burst` and `nodelay` or `delay`.
fn limit_req_params(
    rule: &EdgeRule,
    count: u64,
    per_ms: u64,
    round_stricter: bool,
    notes: &mut Vec<String>,
) -> Result<String, ConfigError> {
    // nginx's burst counts the requests beyond the first one of an instant.
    let at_once = rule.burst - 1;
    fits_nginx(rule, "burst", "burst", at_once)?;
    let Some(delay_ms) = rule.max_delay_ms else {
        return Ok(if at_once == 0 {
            " nodelay".to_owned()
        } else {
            format!(" burst={at_once} nodelay")
        });
    };
    // Requests that may wait: as many as the rate serves within max_delay.
    let scaled = u128::from(delay_ms) * u128::from(count);
    let queued = u64::try_from(scaled / u128::from(per_ms)).unwrap_or(u64::MAX);
    if !scaled.is_multiple_of(u128::from(per_ms)) || queued == 0 {
        let refusal = rule.refuse(
            "max_delay",
            format_args!("{delay_ms}ms"),
            TARGET,
            "nginx delays a whole number of requests, and this max_delay at this rate is not a whole number",
        );
        rule.stricter_or_refuse(
            round_stricter,
            notes,
            refusal,
            format!("{queued} request(s) may wait instead of a fraction more"),
        )?;
    }
    let burst = at_once.saturating_add(queued);
    fits_nginx(rule, "max_delay", "burst", burst)?;
    Ok(match (burst, at_once) {
        (0, _) => " nodelay".to_owned(),
        (b, 0) => format!(" burst={b}"),
        (b, d) => format!(" burst={b} delay={d}"),
    })
}

/// The first section of the `[key]` chain that reads a client address behind proxies.
fn client_ip_section(key: &KeyConfig, path: String) -> Option<(&KeyConfig, String)> {
    if matches!(key.kind, KeyKind::ClientIp | KeyKind::IpUserAgent) {
        return Some((key, path));
    }
    key.fallback
        .as_deref()
        .and_then(|next| client_ip_section(next, format!("{path}.fallback")))
}

/// Refuses an IP-keyed rule over a route whose own key reads the client address behind
/// proxies otherwise than `[key]` does: nginx's `real_ip` is one setting for the whole
/// server, written from `[key]`, so it cannot carry a second reading for one route.
fn route_addresses(plan: &Plan, rules: &[EdgeRule]) -> Result<(), ConfigError> {
    let server = client_ip_section(&plan.key, "key".to_owned())
        .map(|(k, _)| (&k.trusted_proxies, k.header.as_deref()));
    for rule in rules.iter().filter(|r| r.key == Key::Ip) {
        for (k, route) in plan.routes.iter().enumerate() {
            if !rule
                .routes
                .iter()
                .any(|m| m.pattern == route.pattern.trim())
            {
                continue;
            }
            for (path, key) in route.own_keys(k) {
                let Some((own, at)) = client_ip_section(key, path) else {
                    continue;
                };
                if server == Some((&own.trusted_proxies, own.header.as_deref())) {
                    continue;
                }
                let (field, value) = match server {
                    None => ("kind", format!("{:?}", own.kind)),
                    Some((proxies, _)) if *proxies != own.trusted_proxies => {
                        ("trusted_proxies", format!("{:?}", own.trusted_proxies))
                    }
                    Some(_) => ("header", format!("{:?}", own.header)),
                };
                return Err(ConfigError::new(
                    format!("{at}.{field}"),
                    value,
                    format!(
                        "nginx: {} {:?} keys by client IP on {:?}, whose key reads the client address from other proxies or another header than [key] does; nginx reads one client address for the whole server (real_ip, from [key]), so it would count other clients than the origin: read the address as [key] does, or leave the route out of the rule",
                        rule.field("routes"),
                        rule.name,
                        route.pattern
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `real_ip` directives matching the plan's trusted proxies.
fn real_ip(plan: &Plan, out: &mut String) -> Result<(), ConfigError> {
    let Some((key, path)) = client_ip_section(&plan.key, "key".to_owned()) else {
        out.push_str(if reads_peer(&plan.key) {
            "    # The plan's [key] reads the TCP peer: nginx keys on the connection's address too.\n"
        } else {
            "    # The plan's [key] reads no address behind proxies: nginx keys IP rules on the connection's address.\n"
        });
        return Ok(());
    };
    if key.trusted_proxies.is_empty() {
        return Ok(());
    }
    crate::key::TrustedProxies::parse(key.trusted_proxies.iter().map(String::as_str))
        .map_err(|e| e.within(&path))?;
    let header = key.header.as_deref().unwrap_or("x-forwarded-for").trim();
    if header.eq_ignore_ascii_case("forwarded") {
        return Err(ConfigError::new(
            format!("{path}.header"),
            format_args!("{header:?}"),
            "nginx: the real_ip module cannot read the RFC 7239 Forwarded header; have the proxies send X-Forwarded-For",
        ));
    }
    if !header
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(ConfigError::new(
            format!("{path}.header"),
            format_args!("{header:?}"),
            "nginx: real_ip_header takes a header name of letters, digits and `-`",
        ));
    }
    out.push_str(&format!(
        "    # The client address, read as the origin's {path} reads it: from {header}, past the trusted proxies.\n"
    ));
    if header.eq_ignore_ascii_case("x-forwarded-for") {
        out.push_str("    real_ip_header X-Forwarded-For;\n    real_ip_recursive on;\n");
    } else {
        // A one-address header is passed on as nginx resolved it: forwarded as the client
        // sent it, the origin (which trusts nginx) would key by whatever the client wrote.
        out.push_str(&format!(
            "    real_ip_header {header};\n    proxy_set_header {header} $remote_addr;\n"
        ));
    }
    for net in &key.trusted_proxies {
        out.push_str(&format!(
            "    set_real_ip_from {};\n",
            as_nginx_sees(net.trim())
        ));
    }
    Ok(())
}

/// Whether a section of the `[key]` chain keys by the TCP peer's address.
fn reads_peer(key: &KeyConfig) -> bool {
    key.kind == KeyKind::PeerIp || key.fallback.as_deref().is_some_and(reads_peer)
}

/// A trusted proxy as nginx compares it: nginx sees an IPv4 peer as IPv4, so an
/// IPv4-mapped (`::ffff:10.0.0.0/104`) or NAT64 entry, which the origin matches either way,
/// is written as the IPv4 network it stands for (as written it would match no peer, and
/// every client would be read as the proxy).
fn as_nginx_sees(net: &str) -> String {
    if let Ok(net) = net.parse::<ipnet::IpNet>() {
        return crate::key::canonical_net(net).to_string();
    }
    if let Ok(ip) = net.parse::<std::net::IpAddr>() {
        return crate::key::canonical_ip(ip).to_string();
    }
    net.to_owned()
}

/// The largest `burst` nginx keeps right: it counts in thousandths of a request in a signed
/// 64-bit number, so a larger one overflows silently (and one past `i64::MAX` fails
/// `nginx -t`). (A rate cannot reach it: a limit is at most 2^32 - 1.)
const NGINX_MAX_COUNT: u64 = i64::MAX as u64 / 1000;

/// Refuses a count nginx cannot hold, naming the rule's `field`.
fn fits_nginx(rule: &EdgeRule, field: &str, what: &str, count: u64) -> Result<(), ConfigError> {
    if count <= NGINX_MAX_COUNT {
        return Ok(());
    }
    Err(ConfigError::new(
        rule.field(field),
        count,
        format!("nginx: a {what} of {count} requests is more than nginx holds (at most {NGINX_MAX_COUNT})"),
    ))
}

/// Refuses a route pattern nginx would never match: nginx matches locations against the
/// normalised path (percent-encoded bytes decoded, `//` merged, `.` and `..` segments
/// resolved), so such a location would match no request and the rule would limit nothing.
fn decoded_paths(rules: &[EdgeRule]) -> Result<(), ConfigError> {
    for rule in rules {
        for route in &rule.routes {
            let path = crate::limiter::parse_pattern(&route.pattern)
                .map_or(route.pattern.as_str(), |(_, p)| p);
            let why = if path.contains('%') {
                "a pattern with a percent-encoded byte; write the character itself"
            } else if path.contains("//") {
                "a pattern with an empty segment (`//`), which nginx merges"
            } else if path.split('/').any(|s| s == "." || s == "..") {
                "a pattern with a `.` or `..` segment, which nginx resolves"
            } else {
                continue;
            };
            return Err(ConfigError::new(
                rule.field("routes"),
                format_args!("{:?}", route.pattern),
                format!(
                    "nginx: locations match the normalised path, so {why} would match no request"
                ),
            ));
        }
    }
    Ok(())
}

/// A `map` variable's name for `methods`: letters and digits kept, any other byte as `_` and
/// its hex code (`M-SEARCH` is `m_2dsearch`), so that names stay distinct and valid.
fn methods_var(index: usize, methods: &[String]) -> String {
    let mut var = format!("tollgate_edge_{index}");
    for m in methods {
        var.push('_');
        for b in m.bytes() {
            if b.is_ascii_alphanumeric() {
                var.push(char::from(b.to_ascii_lowercase()));
            } else {
                var.push_str(&format!("_{b:02x}"));
            }
        }
    }
    var
}

/// Refuses what would not be one nginx token.
fn plain_option(field: &str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".:[]_-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format_args!("{value:?}"),
            "nginx: an address or port of letters, digits, `.`, `:`, `[`, `]`, `_` and `-`",
        ))
    }
}

fn key_expression(key: &Key) -> String {
    match key {
        Key::Ip => "$binary_remote_addr".to_owned(),
        Key::Header(h) => format!("$http_{}", h.replace('-', "_")),
        Key::Global => "global".to_owned(),
    }
}

/// The `location` line of `path`; a prefix that wins over regexes (`before_regexes`) says
/// `^~`.
fn location_line(path: &PathMatch, before_regexes: bool) -> String {
    match path {
        PathMatch::Exact(p) => format!("location = {p}"),
        PathMatch::Prefix(p) if before_regexes => format!("location ^~ {p}"),
        PathMatch::Prefix(p) => format!("location {p}"),
        PathMatch::Regex(r) => format!("location ~ \"{r}\""),
    }
}

/// Each location's rules: by path, the rules (by index) that limit it, with the methods
/// they count there (`None`: every method).
type Locations = BTreeMap<PathMatch, BTreeMap<usize, Option<Vec<String>>>>;

/// How specific a route's path is, the way the origin's router (matchit, as axum's) prefers
/// one route over another that also matches a path: along the pattern, at the first place
/// they differ, a static character before a parameter, before a catch-all. One element per
/// static character (0), parameter (1) or catch-all (2); smaller is more specific. Two
/// patterns that differ first by their static characters never match the same path.
fn specificity(pattern: &str) -> Vec<u8> {
    let path = crate::limiter::parse_pattern(pattern).map_or(pattern, |(_, p)| p);
    let mut key = Vec::with_capacity(path.len());
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        key.extend(std::iter::repeat_n(0, open));
        let after = &rest[open..];
        let close = after.find('}').unwrap_or(after.len() - 1);
        key.push(if after[1..].starts_with('*') { 2 } else { 1 });
        rest = &after[close + 1..];
    }
    key.extend(std::iter::repeat_n(0, rest.len()));
    key
}

/// What the rules declare, before any location uses them.
#[derive(Default)]
struct Zones {
    /// The file's opening comment: each rule, its nginx rate and the notes about it.
    header: String,
    /// One `limit_req_zone` per rule.
    zones: String,
    /// Each rule's `limit_req` line, by rule index.
    limit_lines: BTreeMap<usize, String>,
}

pub(super) fn export(
    plan: &Plan,
    rules: &[EdgeRule],
    options: &ExportOptions,
    notes: &mut Vec<String>,
) -> Result<String, ConfigError> {
    plain_option("listen", &options.listen)?;
    plain_option("origin", &options.origin)?;
    route_addresses(plan, rules)?;
    decoded_paths(rules)?;
    let zones = zones(plan, rules, options.round_stricter, notes)?;
    let mut locations = locations(rules);
    unlimited_routes(plan, &mut locations);
    let (server, maps) = server(plan, rules, options, &locations, &zones.limit_lines)?;
    let mut out = zones.header;
    out.push('\n');
    out.push_str(&zones.zones);
    if !maps.is_empty() {
        out.push_str(
            "\n# Requests of other methods get an empty key, which limit_req does not count.\n",
        );
        out.push_str(&maps);
    }
    out.push('\n');
    out.push_str(&server);
    Ok(out)
}

/// Each rule's zone and `limit_req` line, and the opening comment describing them.
fn zones(
    plan: &Plan,
    rules: &[EdgeRule],
    round: bool,
    notes: &mut Vec<String>,
) -> Result<Zones, ConfigError> {
    let mut out = Zones {
        header: String::from(
            "# nginx edge limits generated by `tollgate edge nginx` from the plan's [edge] section.\n\
             # Include this file inside nginx's `http { }` block: it defines the server in front of the origin.\n",
        ),
        ..Zones::default()
    };
    let ipv6_prefix = plan
        .key
        .ipv6_prefix
        .unwrap_or(crate::key::DEFAULT_IPV6_PREFIX);
    for rule in rules {
        let before = notes.len();
        rule.block_only(TARGET, round, notes)?;
        let (rate_text, count, per_ms) = rate(rule, round, notes)?;
        let params = limit_req_params(rule, count, per_ms, round, notes)?;
        out.header.push_str(&format!(
            "#\n# edge.rules[{}] {:?}: {}\n#   rate={rate_text},{params} (a leaky bucket: {} at once, then {rate_text})\n",
            rule.index,
            rule.name,
            rule.describe(),
            rule.burst
        ));
        if per_ms == 60_000 && !(count * 1000).is_multiple_of(60) {
            notes.push(format!(
                "edge.rules[{}] {:?}: nginx keeps rates in thousandths of a request per second, so {rate_text} runs as {}.{:03} r/s",
                rule.index,
                rule.name,
                count * 1000 / 60 / 1000,
                (count * 1000 / 60) % 1000
            ));
        }
        if rule.key == Key::Ip {
            notes.push(format!(
                "edge.rules[{}] {:?}: nginx counts each IPv6 address alone, where the origin groups IPv6 clients by /{ipv6_prefix}",
                rule.index, rule.name
            ));
        }
        if let Key::Header(h) = &rule.key {
            notes.push(format!(
                "edge.rules[{}] {:?}: nginx does not count a request without {h} (an empty key): only the origin limits those",
                rule.index, rule.name
            ));
        }
        for note in &notes[before..] {
            out.header.push_str(&format!("#   note: {note}\n"));
        }
        out.zones.push_str(&format!(
            "limit_req_zone $tollgate_edge_{i} zone=tollgate_edge_{i}:10m rate={rate_text};\n",
            i = rule.index
        ));
        out.limit_lines.insert(
            rule.index,
            format!("limit_req zone=tollgate_edge_{}{params};", rule.index),
        );
    }
    Ok(out)
}

/// The rules by location. Each path gets one location; a rule over several methods of it
/// counts them together.
fn locations(rules: &[EdgeRule]) -> (Locations, BTreeMap<PathMatch, Vec<u8>>) {
    let mut locations = Locations::new();
    let mut specific = BTreeMap::new();
    for rule in rules {
        for route in &rule.routes {
            specific
                .entry(route.path.clone())
                .or_insert_with(|| specificity(&route.pattern));
            let at = locations.entry(route.path.clone()).or_default();
            match at.entry(rule.index) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(route.methods.clone());
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    let merged = match (o.get().clone(), &route.methods) {
                        (Some(mut a), Some(b)) => {
                            a.extend(b.iter().cloned());
                            a.sort();
                            a.dedup();
                            Some(a)
                        }
                        _ => None,
                    };
                    o.insert(merged);
                }
            }
        }
    }
    (locations, specific)
}

/// Adds a plain location (no limit, only `proxy_pass`) for each of the plan's routes that no
/// rule names but that the origin prefers over a limited location's route: without one,
/// nginx would count its requests under the less specific route's rule. A route whose
/// pattern the edge cannot write is left out.
fn unlimited_routes(
    plan: &Plan,
    (locations, specific): &mut (Locations, BTreeMap<PathMatch, Vec<u8>>),
) {
    // What a limited location's paths start with (the text before its first parameter),
    // and how specific its route is.
    let limited: Vec<(String, Vec<u8>)> = locations
        .keys()
        .filter_map(|p| match p {
            PathMatch::Exact(_) => None,
            PathMatch::Prefix(text) => Some((text.clone(), specific.get(p)?.clone())),
            PathMatch::Regex(regex) => {
                let text = regex.trim_start_matches('^');
                let text = text
                    .split(['[', '\\', '.', '$'])
                    .next()
                    .unwrap_or("")
                    .to_owned();
                Some((text, specific.get(p)?.clone()))
            }
        })
        .collect();
    for (i, route) in plan.routes.iter().enumerate() {
        let Ok(route) = super::resolve::route_match(&format!("routes[{i}]"), &route.pattern) else {
            continue;
        };
        if locations.contains_key(&route.path) {
            continue;
        }
        let key = specificity(&route.pattern);
        let path = crate::limiter::parse_pattern(&route.pattern).map_or("", |(_, p)| p);
        let text = path.split('{').next().unwrap_or("");
        let overlaps = |start: &str| text.starts_with(start) || start.starts_with(text);
        if limited.iter().any(|(start, l)| *l > key && overlaps(start)) {
            specific.insert(route.path.clone(), key);
            locations.insert(route.path, BTreeMap::new());
        }
    }
}

/// The upstream and the server block with one location per path, and the
/// `map $request_method` blocks its method-limited rules read.
///
/// nginx picks a location its own way: an exact one, else the longest prefix, whose regexes
/// then come first in the order written, unless the prefix says `^~`. The origin picks the
/// most specific route ([`specificity`]). So the regex locations are written most specific
/// first, and a prefix that must win over a less specific regex says `^~` and holds, nested,
/// the regexes more specific than itself: for every path nginx then picks the location of
/// the route the origin picks.
fn server(
    plan: &Plan,
    rules: &[EdgeRule],
    options: &ExportOptions,
    (locations, specific): &(Locations, BTreeMap<PathMatch, Vec<u8>>),
    limit_lines: &BTreeMap<usize, String>,
) -> Result<(String, String), ConfigError> {
    let mut server = format!(
        "upstream tollgate_origin {{\n    server {};\n}}\n\nserver {{\n    listen {};\n    limit_req_status 429;\n",
        options.origin, options.listen
    );
    real_ip(plan, &mut server)?;
    server.push_str(
        "    proxy_set_header Host $host;\n    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n",
    );
    // nginx picks a location by the normalised path and forwards the path as sent, which the
    // origin routes as written: `/api/a/../../x` or `/users/a%2Fb` would pass an unlimited
    // location here and reach a limited route there. Such paths are refused.
    server.push_str(
        "    # A path nginx would rewrite before choosing a location (a dot segment, an encoded\n    # `.` or `/`) reaches the origin as sent, on another route: refused, not passed unlimited.\n    if ($request_uri ~* \"^[^?]*(/\\.\\.?(/|\\?|$)|%2e|%2f)\") {\n        return 400;\n    }\n",
    );
    let mut body = Body {
        rules,
        limit_lines,
        maps: String::new(),
        declared_maps: std::collections::BTreeSet::new(),
    };
    let key = |path: &PathMatch| specific.get(path).cloned().unwrap_or_default();
    let mut regexes: Vec<&PathMatch> = locations
        .keys()
        .filter(|p| matches!(p, PathMatch::Regex(_)))
        .collect();
    regexes.sort_by_key(|p| (key(p), *p));
    for (path, by_rule) in locations {
        match path {
            PathMatch::Exact(_) => {
                server.push_str(&format!("\n    {} {{\n", location_line(path, false)));
                body.write(&mut server, by_rule, "        ");
                server.push_str("    }\n");
            }
            PathMatch::Prefix(text) => {
                // A catch-all matches at least one character after its prefix (`/api/{*rest}`
                // is not `/api/`): the prefix itself is no route of the rule's.
                if !locations.contains_key(&PathMatch::Exact(text.clone())) {
                    server.push_str(&format!(
                        "\n    location = {text} {{\n        proxy_pass http://tollgate_origin;\n    }}\n"
                    ));
                }
                let own = key(path);
                let before_me = regexes.iter().any(|r| key(r) > own);
                server.push_str(&format!("\n    {} {{\n", location_line(path, before_me)));
                if before_me {
                    for regex in regexes.iter().filter(|r| key(r) < own) {
                        server.push_str(&format!("        {} {{\n", location_line(regex, false)));
                        body.write(&mut server, &locations[*regex], "            ");
                        server.push_str("        }\n");
                    }
                }
                body.write(&mut server, by_rule, "        ");
                server.push_str("    }\n");
            }
            PathMatch::Regex(_) => {}
        }
    }
    for regex in &regexes {
        server.push_str(&format!("\n    {} {{\n", location_line(regex, false)));
        body.write(&mut server, &locations[*regex], "        ");
        server.push_str("    }\n");
    }
    if !locations.contains_key(&PathMatch::Prefix("/".to_owned())) {
        server.push_str("\n    location / {\n        proxy_pass http://tollgate_origin;\n    }\n");
    }
    server.push_str("}\n");
    Ok((server, body.maps))
}

/// Writes locations' bodies, and the `map` blocks they read.
struct Body<'a> {
    rules: &'a [EdgeRule],
    limit_lines: &'a BTreeMap<usize, String>,
    maps: String,
    declared_maps: std::collections::BTreeSet<String>,
}

impl Body<'_> {
    /// The `set` and `limit_req` lines of a location's rules, then its `proxy_pass`.
    fn write(
        &mut self,
        out: &mut String,
        by_rule: &BTreeMap<usize, Option<Vec<String>>>,
        indent: &str,
    ) {
        for (index, methods) in by_rule {
            let Some(rule) = self.rules.iter().find(|r| r.index == *index) else {
                continue;
            };
            let key = key_expression(&rule.key);
            let value = match methods {
                None => key,
                Some(methods) => {
                    let var = methods_var(*index, methods);
                    if self.declared_maps.insert(var.clone()) {
                        self.maps
                            .push_str(&format!("map $request_method ${var} {{\n"));
                        for m in methods {
                            self.maps.push_str(&format!("    {m} {key};\n"));
                        }
                        self.maps.push_str("    default \"\";\n}\n");
                    }
                    format!("${var}")
                }
            };
            out.push_str(&format!(
                "{indent}set $tollgate_edge_{index} {value};\n{indent}{}\n",
                self.limit_lines.get(index).map_or("", String::as_str)
            ));
        }
        out.push_str(&format!("{indent}proxy_pass http://tollgate_origin;\n"));
    }
}
