//! Hostile bytes and mutated valid files: never a panic, always a registry or a located error,
//! and a refused reload changes nothing.

use super::*;

/// One change to a valid file: the raw material of the mutation property.
#[derive(Clone, Debug)]
enum Mutation {
    DeleteChar(usize),
    InsertChar(usize, char),
    ReplaceValue(usize, &'static str),
    DuplicateLine(usize),
    DeleteLine(usize),
    SwapLines(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let chars = prop::sample::select(vec![
        '"', '=', '[', ']', '{', '}', ',', '.', '#', '\n', ' ', '0', '9', '-', 'é', '\\', '\'',
    ]);
    let values = prop::sample::select(vec![
        "0",
        "-1",
        "1",
        "4294967295",
        "4294967296",
        "9007199254740992",
        "1.5",
        "nan",
        "\"x\"",
        "[]",
        "{}",
        "true",
        "\"0s\"",
        "\"1152921504606846977ns\"",
        "\"0.5ns\"",
        "1979-05-27",
    ]);
    prop_oneof![
        any::<prop::sample::Index>().prop_map(|i| Mutation::DeleteChar(i.index(BASE.len()))),
        (any::<prop::sample::Index>(), chars)
            .prop_map(|(i, c)| Mutation::InsertChar(i.index(BASE.len()), c)),
        (0..64usize, values).prop_map(|(n, v)| Mutation::ReplaceValue(n, v)),
        (0..64usize).prop_map(Mutation::DuplicateLine),
        (0..64usize).prop_map(Mutation::DeleteLine),
        (0..64usize, 0..64usize).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
    ]
}

fn apply(text: &str, mutation: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let n = lines.len();
    let at = |i: usize| {
        let mut i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match *mutation {
        Mutation::DeleteChar(i) => {
            let mut out = text.to_owned();
            let i = at(i);
            if i < out.len() {
                out.remove(i);
            }
            return out;
        }
        Mutation::InsertChar(i, c) => {
            let mut out = text.to_owned();
            out.insert(at(i), c);
            return out;
        }
        Mutation::ReplaceValue(k, value) => {
            // The k-th value after `=` (wrapping round) becomes `value`.
            let targets: Vec<usize> = (0..n).filter(|&i| lines[i].contains(" = ")).collect();
            if let Some(&i) = targets.get(k % targets.len().max(1)) {
                let (name, _) = lines[i].split_once(" = ").unwrap();
                lines[i] = format!("{name} = {value}");
            }
        }
        Mutation::DuplicateLine(i) => lines.insert(i % n, lines[i % n].clone()),
        Mutation::DeleteLine(i) => drop(lines.remove(i % n)),
        Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
    }
    lines.join("\n") + "\n"
}

/// Builds `text` and reloads it onto a registry of `BASE`, catching panics; every error must be
/// located, an accepted file must reload onto itself as no change, and a refused reload must
/// leave `BASE` running exactly.
fn survives(text: &str) -> Result<(), TestCaseError> {
    let outcome = std::panic::catch_unwind(|| {
        let built = Registry::from_toml_str(text);
        if let Err(err) = &built {
            assert_located(text, err);
        }
        if let Ok(registry) = &built {
            assert_eq!(
                registry.reload_toml_str(text),
                Ok(Reloaded::default()),
                "{text}"
            );
        }
        let registry = Registry::from_toml_str(BASE).unwrap();
        let before = observed(&registry);
        match registry.reload_toml_str(text) {
            Err(err) => {
                assert_located(text, &err);
                assert_eq!(observed(&registry), before, "{text}\n-> {err}");
            }
            Ok(_) => assert!(built.is_ok(), "a reload accepted a file a registry refuses"),
        }
    });
    prop_assert!(outcome.is_ok(), "panicked on {:?}", text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Hostile bytes, read as text as an operator's editor might have saved them.
    #[test]
    fn hostile_bytes_are_a_registry_or_a_located_error(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        prefix in prop::sample::select(vec!["", "[rate_limiters.api]\n", "[bulkheads.b]\n", "[routes.r]\npolicies = "]),
    ) {
        let text = format!("{prefix}{}", String::from_utf8_lossy(&bytes));
        survives(&text)?;
    }

    /// A valid file with one to four edits of the kinds an operator's typo makes.
    #[test]
    fn mutated_valid_files_are_a_registry_or_a_located_error(
        mutations in prop::collection::vec(mutation(), 1..5)
    ) {
        let text = mutations.iter().fold(BASE.to_owned(), |text, m| apply(&text, m));
        survives(&text)?;
    }
}
