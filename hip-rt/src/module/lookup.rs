//! Which kernel of a code object a name means: its symbol (an `extern "C"` name or a mangled
//! C++ symbol), or the demangled C++ name with its parameter list (`scale(float*)`) or without
//! (`saxpy_kernel`, `matrix_multiplication_kernel<16u>`, `ns::kernel`).

/// The demangled name of `symbol` without parameters (`mm<16u>`), and with them
/// (`mm<16u>(float const*, float*)`); None for a name that is not a C++ symbol.
pub fn demangled(symbol: &str) -> Option<(String, String)> {
    let d = hip_codeobj::demangle::demangle(symbol)?;
    let full = d.full();
    Some((d.name, full))
}

/// What `name` resolves to among `kernels` (symbols).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// This symbol.
    One(String),
    /// No kernel has this name.
    None,
    /// Several kernels (overloads, or instances of one template) have this demangled name:
    /// these symbols, with their demangled names with parameters.
    Ambiguous(Vec<(String, String)>),
}

/// Resolves `name` against the kernel symbols `kernels`: an exact symbol first, then a
/// demangled name with parameters (spaces ignored), then one without.
pub fn resolve(name: &str, kernels: &[String]) -> Resolved {
    if kernels.iter().any(|k| k == name) {
        return Resolved::One(name.to_owned());
    }
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let wanted = squash(name);
    let named: Vec<(&String, String, String)> = kernels
        .iter()
        .filter_map(|k| demangled(k).map(|(short, full)| (k, short, full)))
        .collect();
    if let Some((k, _, _)) = named.iter().find(|(_, _, full)| squash(full) == wanted) {
        return Resolved::One((*k).clone());
    }
    let hits: Vec<(String, String)> = named
        .iter()
        .filter(|(_, short, _)| squash(short) == wanted)
        .map(|(k, _, full)| ((*k).clone(), full.clone()))
        .collect();
    match hits.len() {
        0 => Resolved::None,
        1 => Resolved::One(hits[0].0.clone()),
        _ => Resolved::Ambiguous(hits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels() -> Vec<String> {
        [
            "gelu_f32",
            "_Z12saxpy_kernelfPKfPf",
            "_Z28matrix_multiplication_kernelILj16EEvPKfS1_Pfiii",
            "_Z5scalePf",
            "_Z5scalePd",
            "_ZN2ns4innsEPi",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn names_resolve_by_symbol_and_by_demangled_name() {
        let k = kernels();
        let one = |s: &str| Resolved::One(s.to_owned());
        assert_eq!(resolve("gelu_f32", &k), one("gelu_f32"));
        assert_eq!(resolve("_Z5scalePd", &k), one("_Z5scalePd"));
        assert_eq!(resolve("saxpy_kernel", &k), one("_Z12saxpy_kernelfPKfPf"));
        assert_eq!(
            resolve("matrix_multiplication_kernel<16u>", &k),
            one("_Z28matrix_multiplication_kernelILj16EEvPKfS1_Pfiii")
        );
        assert_eq!(resolve("ns::inns", &k), one("_ZN2ns4innsEPi"));
        assert_eq!(resolve("scale(double*)", &k), one("_Z5scalePd"));
        assert_eq!(resolve("scale(float *)", &k), one("_Z5scalePf"));
        assert_eq!(
            resolve("matrix_multiplication_kernel<8u>", &k),
            Resolved::None
        );
        let Resolved::Ambiguous(c) = resolve("scale", &k) else {
            panic!("two overloads")
        };
        assert_eq!(
            c,
            vec![
                ("_Z5scalePf".to_owned(), "scale(float*)".to_owned()),
                ("_Z5scalePd".to_owned(), "scale(double*)".to_owned())
            ]
        );
    }
}
