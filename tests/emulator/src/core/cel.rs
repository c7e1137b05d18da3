//! The subset of CEL that the shipped CRDs' `x-kubernetes-validations` rules use, evaluated the
//! way kube-apiserver's apiextensions-apiserver does (`pkg/apiserver/schema/cel`).
//!
//! Why not a CEL crate: `cel` (the maintained successor of `cel-interpreter`) brings an ANTLR
//! runtime and generated parser into the emulator's build and lacks the Kubernetes extension
//! libraries the rules use (`replace` from the strings library, `type()` on int-or-string), so
//! the rules would need custom functions anyway. The subset here is exactly what
//! `grep -rn x-kubernetes-validations -A3 schemas` lists:
//!
//! - literals (single/double-quoted strings, ints, doubles, `true`/`false`/`null`, lists),
//!   `self`, `oldSelf` (transition rules), the type names `int`, `string`, `bool`, `double`,
//!   `list`, `map`;
//! - `?:`, `||` and `&&` (with CEL's commutative error absorption), `!`, unary `-`, `==`,
//!   `!=`, `<`, `<=`, `>`, `>=`, `in`, `+`, `-`;
//! - field selection (with Kubernetes' property-name escaping: `__namespace__` is `namespace`),
//!   indexing, `has()`, the `all`/`exists` macros;
//! - `size`, `int`, `string`, `type`, `startsWith`, `endsWith`, `contains`, `replace`,
//!   `matches`.
//!
//! Anything else is a parse error, and the emulator panics on a rule it can't parse (a test
//! then says which rule needs teaching) rather than silently skipping it.

use serde_json::Value;
use std::collections::BTreeMap;

/// A CEL value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(String),
    List(Vec<Val>),
    Map(BTreeMap<String, Val>),
    /// A type value (`int`, `string`, ...), what `type(x)` returns.
    Type(&'static str),
}

impl Val {
    /// The CEL value of a JSON value (what the API server decodes the object into).
    pub fn from_json(v: &Value) -> Val {
        match v {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => Val::Double(n.as_f64().unwrap_or(0.0)),
            },
            Value::String(s) => Val::Str(s.clone()),
            Value::Array(a) => Val::List(a.iter().map(Val::from_json).collect()),
            Value::Object(m) => Val::Map(
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), Val::from_json(v)))
                    .collect(),
            ),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "null_type",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Double(_) => "double",
            Val::Str(_) => "string",
            Val::List(_) => "list",
            Val::Map(_) => "map",
            Val::Type(_) => "type",
        }
    }
}

/// An evaluation error, worded like cel-go's (`no such key: x`, `no such overload`).
#[derive(Debug, Clone, PartialEq)]
pub struct EvalError(pub String);

fn no_overload() -> EvalError {
    EvalError("no such overload".into())
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Double(f64),
    Str(String),
    Punct(&'static str),
}

const PUNCTS: &[&str] = &[
    "==", "!=", "<=", ">=", "&&", "||", "(", ")", "[", "]", ".", ",", "?", ":", "!", "-", "+", "<",
    ">", "*", "/", "%",
];

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = vec![];
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            if s.contains('.') {
                out.push(Tok::Double(
                    s.parse().map_err(|_| format!("bad number {s}"))?,
                ));
            } else {
                out.push(Tok::Int(s.parse().map_err(|_| format!("bad number {s}"))?));
            }
        } else if c == '\'' || c == '"' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err("unterminated string".into()),
                    Some(&q) if q == c => break,
                    Some('\\') => {
                        let e = chars.get(i + 1).ok_or("unterminated string")?;
                        s.push(match e {
                            'n' => '\n',
                            't' => '\t',
                            other => *other,
                        });
                        i += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            i += 1;
            out.push(Tok::Str(s));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let p = PUNCTS
                .iter()
                .find(|p| rest.starts_with(**p))
                .ok_or_else(|| format!("unexpected character {c:?}"))?;
            out.push(Tok::Punct(p));
            i += p.len();
        }
    }
    Ok(out)
}

/// A parsed expression.
#[derive(Debug, Clone)]
pub enum Expr {
    Lit(Val),
    Ident(String),
    List(Vec<Expr>),
    Select(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    /// A function (`target` None) or method call.
    Call {
        target: Option<Box<Expr>>,
        name: String,
        args: Vec<Expr>,
    },
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Bin(&'static str, Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }
    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str) -> Result<(), String> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(format!("expected {p:?} at token {}", self.pos))
        }
    }
    fn expr(&mut self) -> Result<Expr, String> {
        let c = self.or()?;
        if self.eat("?") {
            let a = self.expr()?;
            self.expect(":")?;
            let b = self.expr()?;
            return Ok(Expr::Cond(Box::new(c), Box::new(a), Box::new(b)));
        }
        Ok(c)
    }
    fn or(&mut self) -> Result<Expr, String> {
        let mut l = self.and()?;
        while self.eat("||") {
            l = Expr::Bin("||", Box::new(l), Box::new(self.and()?));
        }
        Ok(l)
    }
    fn and(&mut self) -> Result<Expr, String> {
        let mut l = self.rel()?;
        while self.eat("&&") {
            l = Expr::Bin("&&", Box::new(l), Box::new(self.rel()?));
        }
        Ok(l)
    }
    fn rel(&mut self) -> Result<Expr, String> {
        let mut l = self.add()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct(p)) if ["==", "!=", "<", "<=", ">", ">="].contains(p) => *p,
                Some(Tok::Ident(i)) if i == "in" => "in",
                _ => return Ok(l),
            };
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.add()?));
        }
    }
    fn add(&mut self) -> Result<Expr, String> {
        let mut l = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct(p)) if ["+", "-"].contains(p) => *p,
                _ => return Ok(l),
            };
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.unary()?));
        }
    }
    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("-") {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.member()
    }
    fn args(&mut self) -> Result<Vec<Expr>, String> {
        let mut args = vec![];
        if self.eat(")") {
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.eat(")") {
                return Ok(args);
            }
            self.expect(",")?;
        }
    }
    fn member(&mut self) -> Result<Expr, String> {
        let mut e = self.primary()?;
        loop {
            if self.eat(".") {
                let Some(Tok::Ident(name)) = self.peek().cloned() else {
                    return Err("expected a field name".into());
                };
                self.pos += 1;
                if self.eat("(") {
                    let args = self.args()?;
                    e = Expr::Call {
                        target: Some(Box::new(e)),
                        name,
                        args,
                    };
                } else {
                    e = Expr::Select(Box::new(e), name);
                }
            } else if self.eat("[") {
                let i = self.expr()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else {
                return Ok(e);
            }
        }
    }
    fn primary(&mut self) -> Result<Expr, String> {
        let t = self.peek().cloned().ok_or("unexpected end of rule")?;
        self.pos += 1;
        Ok(match t {
            Tok::Int(i) => Expr::Lit(Val::Int(i)),
            Tok::Double(d) => Expr::Lit(Val::Double(d)),
            Tok::Str(s) => Expr::Lit(Val::Str(s)),
            Tok::Ident(i) => match i.as_str() {
                "true" => Expr::Lit(Val::Bool(true)),
                "false" => Expr::Lit(Val::Bool(false)),
                "null" => Expr::Lit(Val::Null),
                _ if self.eat("(") => Expr::Call {
                    target: None,
                    name: i,
                    args: self.args()?,
                },
                _ => Expr::Ident(i),
            },
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                e
            }
            Tok::Punct("[") => {
                let mut items = vec![];
                if !self.eat("]") {
                    loop {
                        items.push(self.expr()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Expr::List(items)
            }
            other => return Err(format!("unexpected {other:?}")),
        })
    }
}

/// Parses a rule.
pub fn parse(src: &str) -> Result<Expr, String> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
    };
    let e = p.expr()?;
    if p.pos != p.toks.len() {
        return Err(format!("unexpected {:?}", p.toks[p.pos]));
    }
    Ok(e)
}

/// Kubernetes' escaping of property names that aren't CEL identifiers
/// (apiserver/pkg/cel `Escape`): `__namespace__` is the property `namespace`, `__dash__` a
/// `-`, `__dot__` a `.`, `__slash__` a `/`, `__underscores__` a `__`.
fn unescape(name: &str) -> String {
    const RESERVED: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if let Some(inner) = name.strip_prefix("__").and_then(|n| n.strip_suffix("__"))
        && RESERVED.contains(&inner)
    {
        return inner.to_string();
    }
    name.replace("__underscores__", "__")
        .replace("__dot__", ".")
        .replace("__dash__", "-")
        .replace("__slash__", "/")
}

type Env<'a> = Vec<(String, &'a Val)>;

fn lookup<'a>(env: &Env<'a>, name: &str) -> Option<&'a Val> {
    env.iter().rev().find(|(n, _)| n == name).map(|(_, v)| *v)
}

fn truth(v: Result<Val, EvalError>) -> Result<bool, EvalError> {
    match v? {
        Val::Bool(b) => Ok(b),
        _ => Err(no_overload()),
    }
}

fn cmp(a: &Val, b: &Val) -> Result<std::cmp::Ordering, EvalError> {
    let o = match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Int(x), Val::Double(y)) => (*x as f64).partial_cmp(y),
        (Val::Double(x), Val::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Val::Double(x), Val::Double(y)) => x.partial_cmp(y),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    };
    o.ok_or_else(no_overload)
}

fn equal(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Double(y)) | (Val::Double(y), Val::Int(x)) => (*x as f64) == *y,
        _ => a == b,
    }
}

/// Evaluates `e` with `self` (and `oldSelf` for transition rules) bound.
pub fn eval(e: &Expr, this: &Val, old: Option<&Val>) -> Result<Val, EvalError> {
    let mut env: Env = vec![("self".into(), this)];
    if let Some(o) = old {
        env.push(("oldSelf".into(), o));
    }
    ev(e, &env)
}

fn ev(e: &Expr, env: &Env) -> Result<Val, EvalError> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Ident(name) => {
            if let Some(v) = lookup(env, name) {
                return Ok(v.clone());
            }
            match name.as_str() {
                "int" => Ok(Val::Type("int")),
                "string" => Ok(Val::Type("string")),
                "bool" => Ok(Val::Type("bool")),
                "double" => Ok(Val::Type("double")),
                "list" => Ok(Val::Type("list")),
                "map" => Ok(Val::Type("map")),
                _ => Err(EvalError(format!("undeclared reference to '{name}'"))),
            }
        }
        Expr::List(items) => Ok(Val::List(
            items.iter().map(|i| ev(i, env)).collect::<Result<_, _>>()?,
        )),
        Expr::Select(target, field) => match ev(target, env)? {
            Val::Map(m) => {
                let key = unescape(field);
                m.get(&key)
                    .cloned()
                    .ok_or_else(|| EvalError(format!("no such key: {key}")))
            }
            _ => Err(no_overload()),
        },
        Expr::Index(target, i) => match (ev(target, env)?, ev(i, env)?) {
            (Val::List(l), Val::Int(i)) => l
                .get(usize::try_from(i).unwrap_or(usize::MAX))
                .cloned()
                .ok_or_else(|| EvalError(format!("index out of bounds: {i}"))),
            (Val::Map(m), Val::Str(k)) => m
                .get(&k)
                .cloned()
                .ok_or_else(|| EvalError(format!("no such key: {k}"))),
            _ => Err(no_overload()),
        },
        Expr::Not(x) => Ok(Val::Bool(!truth(ev(x, env))?)),
        Expr::Neg(x) => match ev(x, env)? {
            Val::Int(i) => Ok(Val::Int(-i)),
            Val::Double(d) => Ok(Val::Double(-d)),
            _ => Err(no_overload()),
        },
        Expr::Cond(c, a, b) => {
            if truth(ev(c, env))? {
                ev(a, env)
            } else {
                ev(b, env)
            }
        }
        Expr::Bin(op @ ("&&" | "||"), l, r) => {
            // CEL's logical operators are commutative over errors: `false && error` and
            // `error && false` are both false.
            let short = *op == "||";
            let lv = truth(ev(l, env));
            if lv == Ok(short) {
                return Ok(Val::Bool(short));
            }
            let rv = truth(ev(r, env));
            if rv == Ok(short) {
                return Ok(Val::Bool(short));
            }
            lv?;
            rv?;
            Ok(Val::Bool(!short))
        }
        Expr::Bin(op, l, r) => {
            let (a, b) = (ev(l, env)?, ev(r, env)?);
            match *op {
                "==" => Ok(Val::Bool(equal(&a, &b))),
                "!=" => Ok(Val::Bool(!equal(&a, &b))),
                "<" => Ok(Val::Bool(cmp(&a, &b)?.is_lt())),
                "<=" => Ok(Val::Bool(cmp(&a, &b)?.is_le())),
                ">" => Ok(Val::Bool(cmp(&a, &b)?.is_gt())),
                ">=" => Ok(Val::Bool(cmp(&a, &b)?.is_ge())),
                "in" => match b {
                    Val::List(l) => Ok(Val::Bool(l.iter().any(|x| equal(x, &a)))),
                    Val::Map(m) => match a {
                        Val::Str(k) => Ok(Val::Bool(m.contains_key(&k))),
                        _ => Err(no_overload()),
                    },
                    _ => Err(no_overload()),
                },
                "+" => match (a, b) {
                    (Val::Int(x), Val::Int(y)) => x
                        .checked_add(y)
                        .map(Val::Int)
                        .ok_or_else(|| EvalError("integer overflow".into())),
                    (Val::Str(x), Val::Str(y)) => Ok(Val::Str(x + &y)),
                    (Val::List(mut x), Val::List(y)) => {
                        x.extend(y);
                        Ok(Val::List(x))
                    }
                    _ => Err(no_overload()),
                },
                "-" => match (a, b) {
                    (Val::Int(x), Val::Int(y)) => x
                        .checked_sub(y)
                        .map(Val::Int)
                        .ok_or_else(|| EvalError("integer overflow".into())),
                    _ => Err(no_overload()),
                },
                _ => Err(no_overload()),
            }
        }
        Expr::Call { target, name, args } => call(target.as_deref(), name, args, env),
    }
}

fn call(target: Option<&Expr>, name: &str, args: &[Expr], env: &Env) -> Result<Val, EvalError> {
    // Macros first: their arguments are not evaluated up front.
    match (target, name, args) {
        (None, "has", [Expr::Select(obj, field)]) => {
            return match ev(obj, env)? {
                Val::Map(m) => Ok(Val::Bool(m.contains_key(&unescape(field)))),
                _ => Err(no_overload()),
            };
        }
        (Some(t), "all" | "exists", [Expr::Ident(var), pred]) => {
            let items: Vec<Val> = match ev(t, env)? {
                Val::List(l) => l,
                Val::Map(m) => m.into_keys().map(Val::Str).collect(),
                _ => return Err(no_overload()),
            };
            let want_all = name == "all";
            // Like && / ||: a decisive result wins over an error met elsewhere.
            let mut err = None;
            for item in &items {
                let mut inner = env.clone();
                inner.push((var.clone(), item));
                match truth(ev(pred, &inner)) {
                    Ok(b) if b != want_all => return Ok(Val::Bool(!want_all)),
                    Ok(_) => {}
                    Err(e) => err = Some(e),
                }
            }
            return match err {
                Some(e) => Err(e),
                None => Ok(Val::Bool(want_all)),
            };
        }
        _ => {}
    }
    let recv = target.map(|t| ev(t, env)).transpose()?;
    let args: Vec<Val> = args.iter().map(|a| ev(a, env)).collect::<Result<_, _>>()?;
    let s = |v: &Val| match v {
        Val::Str(s) => Ok(s.clone()),
        _ => Err(no_overload()),
    };
    match (recv.as_ref(), name, args.as_slice()) {
        (None, "size", [v]) | (Some(v), "size", []) => match v {
            Val::Str(s) => Ok(Val::Int(s.chars().count() as i64)),
            Val::List(l) => Ok(Val::Int(l.len() as i64)),
            Val::Map(m) => Ok(Val::Int(m.len() as i64)),
            _ => Err(no_overload()),
        },
        (None, "type", [v]) => Ok(Val::Type(v.type_name())),
        (None, "int", [v]) => match v {
            Val::Int(i) => Ok(Val::Int(*i)),
            Val::Double(d) => Ok(Val::Int(*d as i64)),
            Val::Str(s) => s
                .parse()
                .map(Val::Int)
                .map_err(|_| EvalError(format!("cannot convert '{s}' to int"))),
            _ => Err(no_overload()),
        },
        (None, "string", [v]) => match v {
            Val::Str(s) => Ok(Val::Str(s.clone())),
            Val::Int(i) => Ok(Val::Str(i.to_string())),
            Val::Bool(b) => Ok(Val::Str(b.to_string())),
            _ => Err(no_overload()),
        },
        (Some(r), "startsWith", [a]) => Ok(Val::Bool(s(r)?.starts_with(&s(a)?))),
        (Some(r), "endsWith", [a]) => Ok(Val::Bool(s(r)?.ends_with(&s(a)?))),
        (Some(r), "contains", [a]) => Ok(Val::Bool(s(r)?.contains(&s(a)?))),
        (Some(r), "replace", [a, b]) => Ok(Val::Str(s(r)?.replace(&s(a)?, &s(b)?))),
        (Some(r), "matches", [a]) => regex::Regex::new(&s(a)?)
            .map(|re| Val::Bool(re.is_match(&s(r).unwrap_or_default())))
            .map_err(|e| EvalError(e.to_string())),
        _ => Err(EvalError(format!(
            "found no matching overload for '{name}'"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(rule: &str, this: Value) -> Result<bool, EvalError> {
        let e = parse(rule).unwrap_or_else(|e| panic!("{rule}: {e}"));
        match eval(&e, &Val::from_json(&this), None)? {
            Val::Bool(b) => Ok(b),
            other => panic!("{rule} gave {other:?}"),
        }
    }

    fn run_old(rule: &str, this: Value, old: Value) -> bool {
        let e = parse(rule).expect("parse");
        eval(&e, &Val::from_json(&this), Some(&Val::from_json(&old))) == Ok(Val::Bool(true))
    }

    // The examples of the Kubernetes documentation "Validation rules"
    // (tasks/extend-kubernetes/custom-resources/custom-resource-definitions.md).
    #[test]
    fn kubernetes_documentation_examples() {
        let obj = json!({"minReplicas": 1, "replicas": 3, "maxReplicas": 5});
        assert_eq!(
            run(
                "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
                obj
            ),
            Ok(true)
        );
        let bad = json!({"minReplicas": 4, "replicas": 3, "maxReplicas": 5});
        assert_eq!(
            run(
                "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
                bad
            ),
            Ok(false)
        );
        assert_eq!(
            run(
                "'Available' in self.stateCounts",
                json!({"stateCounts": {"Available": 1}})
            ),
            Ok(true)
        );
        assert_eq!(
            run(
                "(size(self.list1) == 0) != (size(self.list2) == 0)",
                json!({"list1": [], "list2": [1]})
            ),
            Ok(true)
        );
        assert_eq!(
            run(
                "!('MY_KEY' in self.map1) || self['MY_KEY'].matches('^[a-zA-Z]*$')",
                json!({"map1": {}})
            ),
            Ok(true)
        );
        assert_eq!(
            run(
                "self.envars.all(e, e.name != 'MY_ENV')",
                json!({"envars": [{"name": "A"}, {"name": "MY_ENV"}]})
            ),
            Ok(false)
        );
        assert_eq!(
            run(
                "has(self.expired) && self.created + self.ttl < self.expired",
                json!({"created": 1})
            ),
            Ok(false)
        );
        assert_eq!(
            run("self.health.startsWith('ok')", json!({"health": "ok-1"})),
            Ok(true)
        );
        assert_eq!(
            run(
                "size(self.names) == size(self.names)",
                json!({"names": ["a"]})
            ),
            Ok(true)
        );
        // Transition rule.
        assert!(run_old("self == oldSelf", json!({"a": 1}), json!({"a": 1})));
        assert!(!run_old(
            "self == oldSelf",
            json!({"a": 1}),
            json!({"a": 2})
        ));
        // A missing field is an error, `has` is not.
        assert_eq!(
            run("self.x == 1", json!({})),
            Err(EvalError("no such key: x".into()))
        );
        // CEL's commutative && / ||.
        assert_eq!(run("self.x == 1 && false", json!({})), Ok(false));
        assert_eq!(run("self.x == 1 || true", json!({})), Ok(true));
    }

    // Every rule of the shipped CRDs, with a passing and a failing value each.
    #[test]
    fn shipped_rules() {
        let cases: &[(&str, Value, bool)] = &[
            (
                "self.all(nr, has(nr.to) && size(nr.to) >= 1 && size(nr.to) <= 59)",
                json!([{"from": {"name": "a"}, "to": "x".repeat(59)}]),
                true,
            ),
            (
                "self.all(nr, has(nr.to) && size(nr.to) >= 1 && size(nr.to) <= 59)",
                json!([{"from": {"name": "a"}, "to": "x".repeat(60)}]),
                false,
            ),
            (
                "!has(self.namePrefix) || (size(self.namePrefix) >= 1 && size(self.namePrefix) <= 59)",
                json!({"namePrefix": "p-"}),
                true,
            ),
            (
                "!has(self.nameSuffix) || (size(self.nameSuffix) >= 1 && size(self.nameSuffix) <= 59)",
                json!({"nameSuffix": ""}),
                false,
            ),
            (
                "(has(self.customization) && ((has(self.customization.namePrefix) && size(self.customization.namePrefix) > 0) || (has(self.customization.nameSuffix) && size(self.customization.nameSuffix) > 0))) || (has(self.nameReplacement) && size(self.nameReplacement) > 0)",
                json!({"mode": "Strict"}),
                false,
            ),
            (
                "(has(self.customization) && ((has(self.customization.namePrefix) && size(self.customization.namePrefix) > 0) || (has(self.customization.nameSuffix) && size(self.customization.nameSuffix) > 0))) || (has(self.nameReplacement) && size(self.nameReplacement) > 0)",
                json!({"customization": {"nameSuffix": "-c"}}),
                true,
            ),
            (
                "self.type == 'Start' ? !has(self.force) || !self.force : true",
                json!({"type": "Start", "force": true}),
                false,
            ),
            (
                "self.type == 'Clone' ? has(self.clone) : true",
                json!({"type": "Clone"}),
                false,
            ),
            (
                "!(has(self.migrate)) || self.type == 'Migrate'",
                json!({"type": "Start", "migrate": {}}),
                false,
            ),
            (
                "!has(self.cpu.coreFraction) || self.cpu.coreFraction == 'Auto' || (self.cpu.coreFraction.endsWith('%') && int(self.cpu.coreFraction.replace('%', '')) >= 1 && int(self.cpu.coreFraction.replace('%', '')) <= 100)",
                json!({"cpu": {"coreFraction": "50%"}}),
                true,
            ),
            (
                "!has(self.cpu.coreFraction) || self.cpu.coreFraction == 'Auto' || (self.cpu.coreFraction.endsWith('%') && int(self.cpu.coreFraction.replace('%', '')) >= 1 && int(self.cpu.coreFraction.replace('%', '')) <= 100)",
                json!({"cpu": {"coreFraction": "0%"}}),
                false,
            ),
            (
                "has(self.osType) && self.osType == 'Legacy' && has(self.enableParavirtualization) && !self.enableParavirtualization ? size(self.blockDeviceRefs) <= 4 : true",
                json!({"osType": "Legacy", "enableParavirtualization": false, "blockDeviceRefs": [1, 2, 3, 4, 5]}),
                false,
            ),
            (
                "type(self) == int ? self >= 1 && self <= 100 : self == 'Auto'",
                json!(50),
                true,
            ),
            (
                "type(self) == int ? self >= 1 && self <= 100 : self == 'Auto'",
                json!("5%"),
                false,
            ),
            (
                "self.kind == 'VirtualImage' || self.kind == 'VirtualDisk' || self.kind == 'VirtualDiskSnapshot' ? has(self.__namespace__) && size(self.__namespace__) > 0 : true",
                json!({"kind": "VirtualDisk", "namespace": "ns"}),
                true,
            ),
            (
                "self.kind == 'VirtualImage' || self.kind == 'VirtualDisk' || self.kind == 'VirtualDiskSnapshot' ? has(self.__namespace__) && size(self.__namespace__) > 0 : true",
                json!({"kind": "VirtualDisk"}),
                false,
            ),
            (
                "self.all(am, am in ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'])",
                json!(["ReadWriteOnce", "Bogus"]),
                false,
            ),
            ("self.startsWith('/')", json!("/mnt"), true),
            ("!self.contains('..')", json!("/a/../b"), false),
            ("self == true", json!(false), false),
            ("self.max > self.min", json!({"min": 1, "max": 2}), true),
            (
                "has(self.step) ? self.max > self.step : true",
                json!({"max": 2, "step": 4}),
                false,
            ),
            ("size(self) <= 2048", json!("x".repeat(2049)), false),
        ];
        for (rule, value, want) in cases {
            assert_eq!(run(rule, value.clone()), Ok(*want), "{rule} on {value}");
        }
    }
}

#[cfg(test)]
mod shipped {
    use serde_json::Value;

    fn rules(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for r in m
                    .get("x-kubernetes-validations")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.push(r["rule"].as_str().unwrap_or_default().to_string());
                }
                m.values().for_each(|c| rules(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| rules(c, out)),
            _ => {}
        }
    }

    /// Every rule in the embedded CRDs parses (a rule outside the subset fails here, not in a
    /// request).
    #[test]
    fn every_shipped_rule_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        let mut found = vec![];
        for sub in ["crds/kubevirt", "crds/cdi", "deckhouse"] {
            for entry in std::fs::read_dir(dir.join(sub)).expect("schemas") {
                let path = entry.expect("entry").path();
                if path.extension().is_some_and(|e| e == "yaml") {
                    let text = std::fs::read_to_string(&path).expect("read");
                    // A file may hold several documents (`---` lines between them).
                    for doc in text.split("\n---\n").filter(|d| !d.trim().is_empty()) {
                        let v: Value = yaml_serde::from_str(doc).expect("yaml");
                        rules(&v, &mut found);
                    }
                }
            }
        }
        assert!(found.len() > 40, "{}", found.len());
        for r in found {
            if let Err(e) = super::parse(&r) {
                panic!("{r}: {e}");
            }
        }
    }
}
