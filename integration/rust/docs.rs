//! The docs against the code: every configuration key the config structs accept is in
//! `docs/configuration.md` exactly once (and nothing else is), every method of the IDL's
//! service is defined exactly once in `docs/api.md`, and every sample a doc includes is
//! the file the suite runs (`docs/samples/`, run against a foqsd by `scripts/test.sh`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_reflection::{ContainerFormat, Format, Registry, Tracer, TracerConfig};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every key the configuration file takes, dotted (`server.tls.cert_file`; the fields of
/// an array of tables under its name: `shards.replicas.addr`), from the serde derives.
fn config_keys() -> BTreeSet<String> {
    let mut tracer = Tracer::new(TracerConfig::default());
    let (top, _) = tracer
        .trace_simple_type::<foqs::config::Config>()
        .expect("the config structs trace");
    // Enums are values here: their variants need not all be traced.
    let registry = tracer.registry_unchecked();
    let mut keys = BTreeSet::new();
    walk(&registry, &top, "", &mut keys);
    keys
}

fn walk(registry: &Registry, f: &Format, path: &str, keys: &mut BTreeSet<String>) {
    match f {
        Format::Option(x) | Format::Seq(x) => walk(registry, x, path, keys),
        Format::TypeName(name) => match registry.get(name) {
            Some(ContainerFormat::Struct(fields)) => {
                for field in fields {
                    let p = if path.is_empty() {
                        field.name.clone()
                    } else {
                        format!("{path}.{}", field.name)
                    };
                    walk(registry, &field.value, &p, keys);
                }
            }
            // An enum (`policy = "at_most_once"`) or a newtype: a value, not a section.
            _ => {
                keys.insert(path.to_string());
            }
        },
        _ => {
            keys.insert(path.to_string());
        }
    }
}

/// The keys the reference's tables name in their first column: `` `server.listen` ``;
/// `` `server.tls.cert_file`, `key_file` `` (later names under the first one's section);
/// `` `[[shards]] id`, `url`, `tls.ca_file` `` (all under the array of tables).
fn documented_keys(doc: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for line in doc.lines() {
        let Some(cell) = line.strip_prefix("| `") else {
            continue;
        };
        let cell = format!("`{}", cell.split(" |").next().unwrap_or_default());
        let mut under: Option<(String, bool)> = None;
        for token in cell.split('`').skip(1).step_by(2) {
            let key = match (
                &under,
                token.strip_prefix("[[").and_then(|t| t.split_once("]] ")),
            ) {
                (_, Some((table, key))) => {
                    under = Some((format!("{table}."), true));
                    format!("{table}.{key}")
                }
                (Some((prefix, true)), None) => format!("{prefix}{token}"),
                (Some((prefix, false)), None) if !token.contains('.') => format!("{prefix}{token}"),
                (Some((prefix, false)), None) if !token.starts_with(prefix.as_str()) => {
                    // `tls.key_file` after `replication.tls.ca_file`: under the same
                    // section as the first.
                    let section = prefix.split('.').next().unwrap_or_default();
                    format!("{section}.{token}")
                }
                _ => {
                    if under.is_none() {
                        let section = token.rsplit_once('.').map(|(s, _)| s).unwrap_or("");
                        under = Some((format!("{section}."), false));
                    }
                    token.to_string()
                }
            };
            keys.push(key);
        }
    }
    keys
}

#[test]
fn the_configuration_reference_names_every_key_exactly_once() {
    let code = config_keys();
    assert!(
        code.contains("server.listen") && code.contains("shards.url"),
        "{code:?}"
    );
    let listed = documented_keys(&read("docs/configuration.md"));
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for k in &listed {
        *seen.entry(k.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let doc: BTreeSet<String> = listed.iter().cloned().collect();
    let missing: Vec<_> = code.difference(&doc).collect();
    let unknown: Vec<_> = doc.difference(&code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty() && twice.is_empty(),
        "docs/configuration.md against the config structs:\n  keys it lacks: {missing:?}\n  \
         keys no struct has: {unknown:?}\n  keys listed more than once: {twice:?}"
    );
}

/// The IDL service's methods.
fn idl_methods() -> Vec<String> {
    let idl = read("thrift/foqs.thrift");
    let service = idl
        .split("service Foqs")
        .nth(1)
        .expect("the IDL has service Foqs");
    let body = &service[..service.find("\n}").expect("the service ends")];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('*') && !l.starts_with("/*"))
        .filter_map(|l| {
            let (head, _) = l.split_once('(')?;
            let name = head.split_whitespace().last()?;
            Some(name.to_string())
        })
        .collect()
}

#[test]
fn the_api_reference_defines_every_idl_method_exactly_once() {
    let methods = idl_methods();
    assert!(methods.len() >= 19, "{methods:?}");
    let api = read("docs/api.md");
    let docs: Vec<(String, String)> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .chain([root().join("README.md")])
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for m in &methods {
        // A definition: the name, then its arguments, in bold or as code.
        let defs = |text: &str| {
            text.matches(&format!("**{m}(")).count() + text.matches(&format!("`{m}(")).count()
        };
        if defs(&api) != 1 {
            problems.push(format!("{m}: defined {} times in docs/api.md", defs(&api)));
        }
        for (path, text) in &docs {
            if !path.ends_with("docs/api.md") && defs(text) > 0 {
                problems.push(format!("{m}: defined again in {path}"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// `<!-- sample: docs/samples/FILE -->` before a fenced block: the block is that file.
#[test]
fn every_sample_a_doc_shows_is_the_file_the_suite_runs() {
    let mut samples = 0;
    let mut problems = Vec::new();
    for (path, text) in std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .chain([root().join("README.md")])
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
    {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("<!-- sample: ") {
            rest = &rest[at + "<!-- sample: ".len()..];
            let file = rest[..rest.find(" -->").expect("a closed marker")].to_string();
            let fence = rest.find("```").expect("a block after the marker");
            let body_at = fence + rest[fence..].find('\n').unwrap() + 1;
            let end = body_at + rest[body_at..].find("```").expect("a closed block");
            let shown = &rest[body_at..end];
            samples += 1;
            match std::fs::read_to_string(root().join(&file)) {
                Ok(f) if f == shown => {}
                Ok(_) => problems.push(format!(
                    "{}: the block of {file} differs from the file",
                    rel(&path)
                )),
                Err(e) => problems.push(format!("{}: {file}: {e}", rel(&path))),
            }
            rest = &rest[end..];
        }
    }
    assert!(samples >= 2, "the docs include at least the tour's samples");
    assert!(problems.is_empty(), "{problems:#?}");
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}
