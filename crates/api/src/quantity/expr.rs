//! The expression language of `resourcesPolicy.resourcesExpr` (upstream's
//! `pkg/util/calculator`), parsed into a tree, type-checked, then evaluated.
//!
//! Grammar (operators left-associative, `*` `/` binding tighter than `+` `-`, unary minus
//! tightest):
//!
//! ```text
//! expr    := term (("+" | "-") term)*
//! term    := unary (("*" | "/") unary)*
//! unary   := "-" unary | primary
//! primary := number | quantity | variable | function "(" expr "," expr ")" | "(" expr ")"
//! ```
//!
//! - a number is a decimal float (`2`, `0.5`, `.5`, `1e3`), optionally with `%` (`50%` is 0.5);
//! - a quantity is a number followed by one of the units `m k M G T P Ki Mi Gi Ti Pi` (`50m`,
//!   `100Mi`);
//! - the one variable is the resource the field computes (`cpu` in a `cpu` field, `memory` in a
//!   `memory` field), bound to the aggregated value of the target containers;
//! - the functions are `max` and `min`, with exactly two arguments; names and the variable are
//!   case-insensitive.
//!
//! Values are numbers or quantities, as upstream: `+` `-` of a quantity and a number turn the
//! number into a quantity (`2` is two cores, two bytes); a quantity can be multiplied or divided
//! by a number, never by a quantity; a quantity times or over a number is computed in
//! thousandths, rounded as upstream (`MilliValue` up, the product truncated); `max`/`min` of a
//! number and a quantity compare them as quantities. A result that is a number becomes a
//! quantity in thousandths; a negative result is an error.
//!
//! Differences from upstream, all stricter: a malformed number (`2e`, `5K`, `.`) is an error
//! (upstream reads it as 0); multiplying by or dividing by the variable's quantity is a type
//! error found when the SidecarSet is validated (upstream accepts it there and fails every pod).

use super::Qty;

/// Which resource an expression computes, and so which variable it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Cpu,
    Memory,
}

impl Resource {
    /// The variable's name (`cpu` or `memory`).
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }
}

/// Why an expression cannot be parsed or evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    #[error("empty expression")]
    Empty,
    #[error("unexpected character {0:?} at column {1}")]
    UnexpectedChar(char, usize),
    #[error("invalid number {0:?}")]
    InvalidNumber(String),
    #[error("invalid quantity {0:?}")]
    InvalidQuantity(String),
    #[error("syntax error at column {column}: expected {expected}")]
    Syntax {
        column: usize,
        expected: &'static str,
    },
    #[error("unknown function: {0}")]
    UnknownFunction(String),
    #[error("{0} function requires exactly 2 arguments, got {1}")]
    Arity(String, usize),
    #[error("undefined variable: {name} (this expression may use only {allowed})")]
    UndefinedVariable { name: String, allowed: &'static str },
    #[error("multiplication of two quantities")]
    QuantityTimesQuantity,
    #[error("division by quantity")]
    DivisionByQuantity,
    #[error("division by zero")]
    DivisionByZero,
    #[error("calculation result is negative: {0}")]
    Negative(String),
    #[error("value out of range")]
    OutOfRange,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Func {
    Max,
    Min,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Number(f64),
    Quantity(Qty),
    Variable,
    Neg(Box<Node>),
    Binary(Op, Box<Node>, Box<Node>),
    Call(Func, Box<Node>, Box<Node>),
}

/// A parsed, type-checked expression for one resource.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceExpr {
    root: Node,
}

impl ResourceExpr {
    /// Parses `text`, an expression computing `resource`.
    pub fn parse(text: &str, resource: Resource) -> Result<Self, ExprError> {
        let tokens = lex(text)?;
        if tokens.is_empty() {
            return Err(ExprError::Empty);
        }
        let mut parser = Parser {
            tokens,
            pos: 0,
            resource,
            end: text.len() + 1,
        };
        let root = parser.expr()?;
        if parser.pos < parser.tokens.len() {
            return Err(ExprError::Syntax {
                column: parser.column(),
                expected: "an operator or the end",
            });
        }
        type_of(&root)?;
        Ok(Self { root })
    }

    /// The value for `variable` (the aggregated value of the target containers).
    pub fn evaluate(&self, variable: &Qty) -> Result<Qty, ExprError> {
        match eval(&self.root, variable)? {
            Value::Number(n) if n < 0.0 => Err(ExprError::Negative(format!("{n}"))),
            Value::Number(n) => Qty::from_number(n),
            Value::Quantity(q) if q.nanos < 0 => Err(ExprError::Negative(q.to_text())),
            Value::Quantity(q) => Ok(q),
        }
    }
}

/// Admission's check of an expression: it parses, type-checks, and evaluates for a variable of
/// 1 (as upstream's validation does, so constant errors such as a division by zero or a
/// negative result are found).
pub fn validate(text: &str, resource: Resource) -> Result<(), ExprError> {
    ResourceExpr::parse(text, resource)?.evaluate(&Qty::from_number(1.0)?)?;
    Ok(())
}

// --- Lexing -------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Number(f64),
    Quantity(Qty),
    Ident(String),
    Punct(char),
}

/// Tokens with their 1-based columns.
fn lex(text: &str) -> Result<Vec<(Tok, usize)>, ExprError> {
    const UNITS: [&str; 11] = ["m", "k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let b = bytes[pos];
        let column = pos + 1;
        if b.is_ascii_whitespace() || b == 0x0b {
            pos += 1;
        } else if b"+-*/(),".contains(&b) {
            out.push((Tok::Punct(char::from(b)), column));
            pos += 1;
        } else if b.is_ascii_digit() || b == b'.' {
            // Upstream's number scanner: digits, one dot, one exponent (a sign only right after
            // it), one percent sign, then letters as a unit.
            let start = pos;
            let (mut dot, mut exp, mut percent, mut want_exp_digit) = (false, false, false, false);
            while pos < bytes.len() {
                let c = bytes[pos];
                if c.is_ascii_digit() {
                    want_exp_digit = false;
                } else if c == b'.' && !dot && !exp && !percent {
                    dot = true;
                } else if matches!(c, b'e' | b'E') && !exp && !percent {
                    exp = true;
                    want_exp_digit = true;
                } else if matches!(c, b'+' | b'-') && want_exp_digit {
                    want_exp_digit = false;
                } else if c == b'%' && !percent {
                    percent = true;
                } else {
                    break;
                }
                pos += 1;
            }
            let number_end = pos;
            if !want_exp_digit {
                while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
                    pos += 1;
                }
            }
            let token = &text[start..pos];
            let unit = &text[number_end..pos];
            if unit.is_empty() {
                out.push((Tok::Number(parse_number(token)?), column));
            } else if UNITS.contains(&unit) && !percent {
                let q =
                    Qty::parse(token).ok_or_else(|| ExprError::InvalidQuantity(token.into()))?;
                out.push((Tok::Quantity(q), column));
            } else {
                return Err(ExprError::InvalidNumber(token.into()));
            }
        } else if b.is_ascii_alphabetic() {
            let start = pos;
            while pos < bytes.len() && (bytes[pos].is_ascii_alphanumeric() || bytes[pos] == b'_') {
                pos += 1;
            }
            out.push((Tok::Ident(text[start..pos].to_ascii_lowercase()), column));
        } else {
            let c = text[pos..].chars().next().unwrap_or('?');
            return Err(ExprError::UnexpectedChar(c, column));
        }
    }
    Ok(out)
}

fn parse_number(token: &str) -> Result<f64, ExprError> {
    let invalid = || ExprError::InvalidNumber(token.to_owned());
    let (digits, scale) = match token.strip_suffix('%') {
        Some(d) => (d, 100.0),
        None => (token, 1.0),
    };
    let n: f64 = digits.parse().map_err(|_| invalid())?;
    if !n.is_finite() {
        return Err(invalid());
    }
    Ok(n / scale)
}

// --- Parsing ------------------------------------------------------------------------------------

struct Parser {
    tokens: Vec<(Tok, usize)>,
    pos: usize,
    resource: Resource,
    end: usize,
}

impl Parser {
    fn column(&self) -> usize {
        self.tokens.get(self.pos).map_or(self.end, |(_, c)| *c)
    }

    fn peek_punct(&self) -> Option<char> {
        match self.tokens.get(self.pos) {
            Some((Tok::Punct(c), _)) => Some(*c),
            _ => None,
        }
    }

    fn expect(&mut self, c: char, expected: &'static str) -> Result<(), ExprError> {
        if self.peek_punct() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(ExprError::Syntax {
                column: self.column(),
                expected,
            })
        }
    }

    fn expr(&mut self) -> Result<Node, ExprError> {
        let mut left = self.term()?;
        while let Some(c @ ('+' | '-')) = self.peek_punct() {
            self.pos += 1;
            let right = self.term()?;
            let op = if c == '+' { Op::Add } else { Op::Sub };
            left = Node::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn term(&mut self) -> Result<Node, ExprError> {
        let mut left = self.unary()?;
        while let Some(c @ ('*' | '/')) = self.peek_punct() {
            self.pos += 1;
            let right = self.unary()?;
            let op = if c == '*' { Op::Mul } else { Op::Div };
            left = Node::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Node, ExprError> {
        if self.peek_punct() == Some('-') {
            self.pos += 1;
            return Ok(Node::Neg(Box::new(self.unary()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Node, ExprError> {
        let column = self.column();
        let Some((token, _)) = self.tokens.get(self.pos).cloned() else {
            return Err(ExprError::Syntax {
                column,
                expected: "a value",
            });
        };
        self.pos += 1;
        match token {
            Tok::Number(n) => Ok(Node::Number(n)),
            Tok::Quantity(q) => Ok(Node::Quantity(q)),
            Tok::Punct('(') => {
                let inner = self.expr()?;
                self.expect(')', "\")\"")?;
                Ok(inner)
            }
            Tok::Ident(name) if self.peek_punct() == Some('(') => {
                self.pos += 1;
                let mut args = vec![self.expr()?];
                while self.peek_punct() == Some(',') {
                    self.pos += 1;
                    args.push(self.expr()?);
                }
                self.expect(')', "\",\" or \")\"")?;
                let func = match name.as_str() {
                    "max" => Func::Max,
                    "min" => Func::Min,
                    _ => return Err(ExprError::UnknownFunction(name)),
                };
                let count = args.len();
                let mut args = args.into_iter();
                match (args.next(), args.next(), args.next()) {
                    (Some(a), Some(b), None) => Ok(Node::Call(func, Box::new(a), Box::new(b))),
                    _ => Err(ExprError::Arity(name, count)),
                }
            }
            Tok::Ident(name) if name == self.resource.as_str() => Ok(Node::Variable),
            Tok::Ident(name) => Err(ExprError::UndefinedVariable {
                name,
                allowed: self.resource.as_str(),
            }),
            Tok::Punct(_) => Err(ExprError::Syntax {
                column,
                expected: "a value",
            }),
        }
    }
}

// --- Types and evaluation -----------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Number,
    Quantity,
}

/// The kind of a node's value; the variable is a quantity.
fn type_of(node: &Node) -> Result<Kind, ExprError> {
    Ok(match node {
        Node::Number(_) => Kind::Number,
        Node::Quantity(_) | Node::Variable => Kind::Quantity,
        Node::Neg(inner) => type_of(inner)?,
        Node::Binary(op, a, b) => match (op, type_of(a)?, type_of(b)?) {
            (Op::Mul, Kind::Quantity, Kind::Quantity) => {
                return Err(ExprError::QuantityTimesQuantity);
            }
            (Op::Div, _, Kind::Quantity) => return Err(ExprError::DivisionByQuantity),
            (_, Kind::Number, Kind::Number) => Kind::Number,
            _ => Kind::Quantity,
        },
        Node::Call(_, a, b) => match (type_of(a)?, type_of(b)?) {
            (Kind::Number, Kind::Number) => Kind::Number,
            _ => Kind::Quantity,
        },
    })
}

#[derive(Clone, Debug)]
enum Value {
    Number(f64),
    Quantity(Qty),
}

impl Value {
    fn into_qty(self) -> Result<Qty, ExprError> {
        match self {
            Value::Number(n) => Qty::from_number(n),
            Value::Quantity(q) => Ok(q),
        }
    }
}

fn eval(node: &Node, variable: &Qty) -> Result<Value, ExprError> {
    Ok(match node {
        Node::Number(n) => Value::Number(*n),
        Node::Quantity(q) => Value::Quantity(q.clone()),
        Node::Variable => Value::Quantity(variable.clone()),
        Node::Neg(inner) => match eval(inner, variable)? {
            Value::Number(n) => Value::Number(-n),
            Value::Quantity(q) => Value::Quantity(q.neg()),
        },
        Node::Binary(op, a, b) => {
            let (a, b) = (eval(a, variable)?, eval(b, variable)?);
            match (op, a, b) {
                (Op::Add, Value::Number(x), Value::Number(y)) => Value::Number(x + y),
                (Op::Sub, Value::Number(x), Value::Number(y)) => Value::Number(x - y),
                (Op::Mul, Value::Number(x), Value::Number(y)) => Value::Number(x * y),
                (Op::Div, Value::Number(_), Value::Number(0.0)) => {
                    return Err(ExprError::DivisionByZero);
                }
                (Op::Div, Value::Number(x), Value::Number(y)) => Value::Number(x / y),
                (Op::Add, x, y) => Value::Quantity(x.into_qty()?.add(&y.into_qty()?)?),
                (Op::Sub, x, y) => Value::Quantity(x.into_qty()?.add(&y.into_qty()?.neg())?),
                (Op::Mul, Value::Quantity(q), Value::Number(n))
                | (Op::Mul, Value::Number(n), Value::Quantity(q)) => {
                    Value::Quantity(q.scale_millis(|m| m * n)?)
                }
                (Op::Div, Value::Quantity(_), Value::Number(0.0)) => {
                    return Err(ExprError::DivisionByZero);
                }
                (Op::Div, Value::Quantity(q), Value::Number(n)) => {
                    Value::Quantity(q.scale_millis(|m| m / n)?)
                }
                (Op::Mul, _, _) => return Err(ExprError::QuantityTimesQuantity),
                (Op::Div, _, _) => return Err(ExprError::DivisionByQuantity),
            }
        }
        Node::Call(func, a, b) => {
            let (a, b) = (eval(a, variable)?, eval(b, variable)?);
            if let (Value::Number(x), Value::Number(y)) = (&a, &b) {
                // Ties and NaN keep upstream's choice of operand.
                let left = match func {
                    Func::Max => x >= y,
                    Func::Min => x <= y,
                };
                return Ok(Value::Number(if left { *x } else { *y }));
            }
            let (a, b) = (a.into_qty()?, b.into_qty()?);
            let left = match func {
                Func::Max => a.nanos >= b.nanos,
                Func::Min => a.nanos <= b.nanos,
            };
            Value::Quantity(if left { a } else { b })
        }
    })
}
