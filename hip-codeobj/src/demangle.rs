//! Readable names of C++ kernel symbols (Itanium mangling, as clang gives `__global__`
//! functions): `_Z28matrix_multiplication_kernelILj16EEvPKfS1_Pfiii` is
//! `matrix_multiplication_kernel<16u>` with the parameters `float const*, float const*,
//! float*, int, int, int`. Integer template arguments are written as literals with their
//! suffix (`16u`), as `c++filt` writes them, which is also valid C++.

use cpp_demangle::{DemangleOptions, Symbol};

/// The parts of a demangled kernel symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demangled {
    /// The qualified name with template arguments, without return type or parameters
    /// (`ns::mm<16u>`).
    pub name: String,
    /// The parameter list, without the parentheses (`float const*, int`).
    pub params: String,
}

impl Demangled {
    /// `name(params)`.
    pub fn full(&self) -> String {
        format!("{}({})", self.name, self.params)
    }
}

/// The demangled form of `symbol`, or None for a name that is not an Itanium C++ function
/// symbol (an `extern "C"` kernel's name).
pub fn demangle(symbol: &str) -> Option<Demangled> {
    if !symbol.starts_with("_Z") {
        return None;
    }
    let sym = Symbol::new(symbol).ok()?;
    let opts = DemangleOptions::new().no_return_type();
    let full = literals(&sym.demangle(&opts).ok()?);
    let name = literals(&sym.demangle(&opts.no_params()).ok()?);
    let params = full.strip_prefix(name.as_str())?.strip_prefix('(')?;
    let params = params.strip_suffix(')')?.to_string();
    Some(Demangled { name, params })
}

/// The demangled name of a variable's symbol (`_ZN2ns5tableE` -> `ns::table`), or None.
pub fn demangle_name(symbol: &str) -> Option<String> {
    if !symbol.starts_with("_Z") {
        return None;
    }
    let sym = Symbol::new(symbol).ok()?;
    Some(literals(&sym.demangle(&DemangleOptions::new()).ok()?))
}

/// `(unsigned int)16` -> `16u` (and the other integer types' suffixes), `(bool)1` -> `true`.
fn literals(text: &str) -> String {
    const CASTS: &[(&str, &str)] = &[
        ("(unsigned long long)", "ull"),
        ("(unsigned long)", "ul"),
        ("(unsigned int)", "u"),
        ("(long long)", "ll"),
        ("(long)", "l"),
        ("(int)", ""),
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for (cast, suffix) in CASTS {
            if let Some(after) = rest.strip_prefix(cast) {
                let digits: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '-')
                    .collect();
                if !digits.is_empty() {
                    out.push_str(&digits);
                    out.push_str(suffix);
                    rest = &after[digits.len()..];
                    continue 'scan;
                }
            }
        }
        for (cast, word) in [("(bool)1", "true"), ("(bool)0", "false")] {
            if let Some(after) = rest.strip_prefix(cast) {
                out.push_str(word);
                rest = after;
                continue 'scan;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_demangle_to_name_and_parameters() {
        let d = demangle("_Z28matrix_multiplication_kernelILj16EEvPKfS1_Pfiii").unwrap();
        assert_eq!(d.name, "matrix_multiplication_kernel<16u>");
        assert_eq!(
            d.params,
            "float const*, float const*, float*, int, int, int"
        );
        let d = demangle("_Z12saxpy_kernelfPK15HIP_vector_typeIfLj4EEPf").unwrap();
        assert_eq!(
            d.full(),
            "saxpy_kernel(float, HIP_vector_type<float, 4u> const*, float*)"
        );
        let d = demangle("_ZN2ns4innsEPi").unwrap();
        assert_eq!((d.name.as_str(), d.params.as_str()), ("ns::inns", "int*"));
        assert_eq!(demangle("_Z1kv").unwrap().params, "");
        assert_eq!(demangle("_Z2tkIiLb1EEvPT_").unwrap().name, "tk<int, true>");
        assert_eq!(demangle("_Z1kPFviE").unwrap().params, "void (*)(int)");
        assert_eq!(demangle("gelu_f32"), None);
        assert_eq!(demangle_name("_ZN2ns5tableE").as_deref(), Some("ns::table"));
        assert_eq!(demangle("_Znot a symbol"), None);
    }
}
