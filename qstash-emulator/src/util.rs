//! Small helpers: ids, clocks, durations, the retry-delay expression language and request signing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    now_ms() / 1000
}

/// `prefix` followed by `len` random alphanumeric characters.
pub(crate) fn random_id(prefix: &str, len: usize) -> String {
    let tail: String = rand::rng().sample_iter(&Alphanumeric).take(len).map(char::from).collect();
    format!("{prefix}{tail}")
}

/// A fresh signing key in QStash's shape (`sig_` and 28 characters).
pub(crate) fn random_signing_key() -> String {
    random_id("sig_", 28)
}

/// Parses QStash's duration strings: `10s`, `2m`, `1h30m`, `1d`, `500ms`, Go's `ns`/`us`/`µs`,
/// and a bare number (seconds). Returns `None` on anything else.
pub(crate) fn parse_duration(input: &str) -> Option<Duration> {
    let s = input.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let factor = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return None,
        };
        total += value * factor;
    }
    total.is_finite().then(|| Duration::from_secs_f64(total))
}

/// QStash's default backoff before retry number `n` (1-based): `min(86400, e^(2.5 n))` seconds.
pub(crate) fn default_backoff(n: u32) -> Duration {
    let secs = (2.5 * f64::from(n)).exp().min(86400.0);
    Duration::from_secs_f64(secs)
}

/// The delay a failed response asks for through `Retry-After`, `X-RateLimit-Reset`,
/// `X-RateLimit-Reset-Requests` or `X-RateLimit-Reset-Tokens` (seconds, an RFC 1123 date, or a
/// duration such as `6m5s`). Values beyond one day are ignored, as QStash does.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    const NAMES: [&str; 4] =
        ["retry-after", "x-ratelimit-reset", "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"];
    for name in NAMES {
        let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) else { continue };
        let value = value.trim();
        let parsed = parse_duration(value).or_else(|| {
            httpdate::parse_http_date(value)
                .ok()
                .map(|at| at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
        });
        if let Some(d) = parsed {
            if d <= Duration::from_secs(86400) {
                return Some(d);
            }
            return None;
        }
    }
    None
}

// ------------------------------------------------------------------- retry-delay expressions

/// A parsed `Upstash-Retry-Delay` expression (milliseconds), over the variable `retried`.
#[derive(Debug, Clone)]
pub(crate) enum Expr {
    Num(f64),
    Retried,
    Neg(Box<Expr>),
    Bin(char, Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
}

impl Expr {
    /// Parses an expression: numbers, `retried`, `+ - * /`, parentheses, and the functions
    /// `pow sqrt abs exp floor ceil round min max`.
    pub(crate) fn parse(input: &str) -> Result<Expr, String> {
        let tokens = tokenize(input)?;
        let mut p = Parser { tokens, pos: 0 };
        let e = p.expr()?;
        if p.pos != p.tokens.len() {
            return Err(format!("unexpected token at position {}", p.pos));
        }
        Ok(e)
    }

    /// Evaluates with `retried` bound.
    pub(crate) fn eval(&self, retried: f64) -> f64 {
        match self {
            Expr::Num(n) => *n,
            Expr::Retried => retried,
            Expr::Neg(e) => -e.eval(retried),
            Expr::Bin(op, a, b) => {
                let (a, b) = (a.eval(retried), b.eval(retried));
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ => a / b,
                }
            }
            Expr::Call(name, args) => {
                let v: Vec<f64> = args.iter().map(|a| a.eval(retried)).collect();
                match name.as_str() {
                    "pow" => v[0].powf(v[1]),
                    "sqrt" => v[0].sqrt(),
                    "abs" => v[0].abs(),
                    "exp" => v[0].exp(),
                    "floor" => v[0].floor(),
                    "ceil" => v[0].ceil(),
                    "round" => v[0].round(),
                    "min" => v.iter().copied().fold(f64::INFINITY, f64::min),
                    _ => v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    Op(char),
}

fn tokenize(input: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            out.push(Tok::Num(s.parse().map_err(|_| format!("bad number {s:?}"))?));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if "+-*/(),".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else {
            return Err(format!("unexpected character {c:?}"));
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn eat(&mut self, op: char) -> bool {
        if self.peek() == Some(&Tok::Op(op)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<Expr, String> {
        let mut left = self.term()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Op(c @ ('+' | '-'))) => *c,
                _ => return Ok(left),
            };
            self.pos += 1;
            left = Expr::Bin(op, Box::new(left), Box::new(self.term()?));
        }
    }

    fn term(&mut self) -> Result<Expr, String> {
        let mut left = self.factor()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Op(c @ ('*' | '/'))) => *c,
                _ => return Ok(left),
            };
            self.pos += 1;
            left = Expr::Bin(op, Box::new(left), Box::new(self.factor()?));
        }
    }

    fn factor(&mut self) -> Result<Expr, String> {
        match self.tokens.get(self.pos).cloned() {
            Some(Tok::Op('-')) => {
                self.pos += 1;
                Ok(Expr::Neg(Box::new(self.factor()?)))
            }
            Some(Tok::Op('(')) => {
                self.pos += 1;
                let e = self.expr()?;
                if !self.eat(')') {
                    return Err("missing ')'".into());
                }
                Ok(e)
            }
            Some(Tok::Num(n)) => {
                self.pos += 1;
                Ok(Expr::Num(n))
            }
            Some(Tok::Ident(name)) => {
                self.pos += 1;
                if name == "retried" {
                    return Ok(Expr::Retried);
                }
                let arity: Option<usize> = match name.as_str() {
                    "pow" => Some(2),
                    "sqrt" | "abs" | "exp" | "floor" | "ceil" | "round" => Some(1),
                    "min" | "max" => None,
                    _ => return Err(format!("unknown identifier {name:?}")),
                };
                if !self.eat('(') {
                    return Err(format!("expected '(' after {name}"));
                }
                let mut args = vec![self.expr()?];
                while self.eat(',') {
                    args.push(self.expr()?);
                }
                if !self.eat(')') {
                    return Err("missing ')'".into());
                }
                match arity {
                    Some(n) if args.len() != n => Err(format!("{name} takes {n} argument(s)")),
                    _ => Ok(Expr::Call(name, args)),
                }
            }
            other => Err(format!("unexpected {other:?}")),
        }
    }
}

// -------------------------------------------------------------------------------- signing

/// The `Upstash-Signature` JWT: HS256 over `{iss, sub, exp, nbf, iat, jti, body}` where `body` is
/// the base64url (padded) SHA-256 of the raw body, as QStash sends it.
pub(crate) fn sign(key: &str, url: &str, body: &[u8]) -> String {
    let now = now_secs();
    let claims = serde_json::json!({
        "iss": "Upstash",
        "sub": url,
        "exp": now + 300,
        "nbf": now,
        "iat": now,
        "jti": random_id("jwt_", 28),
        "body": URL_SAFE.encode(Sha256::digest(body)),
    });
    let key = jsonwebtoken::EncodingKey::from_secret(key.as_bytes()).expect("an HMAC key of any length");
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key)
        .expect("HS256 claims always sign")
}

/// `body` as UTF-8 when it is, else `None`; the caller then sends base64.
pub(crate) fn utf8_or_base64(body: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(body) {
        Ok(s) => (Some(s.to_owned()), None),
        Err(_) => (None, Some(STANDARD.encode(body))),
    }
}

/// Base64 (standard) of `body`.
pub(crate) fn base64(body: &[u8]) -> String {
    STANDARD.encode(body)
}

/// Hex SHA-256 of the parts, for content-based deduplication.
pub(crate) fn content_hash(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration("5y"), None);
    }

    #[test]
    fn expressions() {
        let e = Expr::parse("pow(2, retried) * 1000").unwrap();
        assert_eq!(e.eval(0.0), 1000.0);
        assert_eq!(e.eval(3.0), 8000.0);
        assert_eq!(Expr::parse("1000 * (1 + retried)").unwrap().eval(2.0), 3000.0);
        assert_eq!(Expr::parse("max(1000, pow(2, retried) * 100)").unwrap().eval(1.0), 1000.0);
        assert_eq!(Expr::parse("-5 + 10 / 2").unwrap().eval(0.0), 0.0);
        assert!(Expr::parse("pow(2)").is_err());
        assert!(Expr::parse("foo + 1").is_err());
        assert!(Expr::parse("(1").is_err());
    }

    #[test]
    fn backoff_matches_the_table() {
        assert_eq!(default_backoff(1).as_secs(), 12);
        assert_eq!(default_backoff(2).as_secs(), 148);
        assert_eq!(default_backoff(6).as_secs(), 86400);
    }
}
