//! The module graph of `src/`, read from the code: no cycle between files
//! or between top-level modules, every arrow between top-level modules
//! stays on its layer or goes down the layers that
//! `docs/adr/0015-module-layers.md` lists, and no import goes through the
//! crate root's re-exports.
//!
//! An arrow is a `use crate::…`, `super::…` or `self::…` path, or an inline
//! `crate::…`, `super::…` or child-module path (macro calls: `crate::…` and
//! `super::…`), outside `#[cfg(test)]` items. It
//! points at the file that defines the name: a re-export (`pub use`) or a
//! private import is followed to its source, so a `mod.rs` that only wires
//! its children is never in a cycle of theirs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

type ModPath = Vec<String>;

/// A path as written in module `here`.
struct Use {
    here: ModPath,
    path: ModPath,
    reexport: bool,
}

/// One source file: its module path and what it names.
struct Source {
    file: PathBuf,
    /// Every crate-internal path it uses, with the module it is used in,
    /// and whether a `pub use` re-exports it.
    uses: Vec<Use>,
    /// `use` items: the name they bring into a module, and where it comes from.
    aliases: Vec<(ModPath, String, ModPath)>,
}

fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// Every `.rs` file under `dir` (the docs test reads them too).
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if has_ident(l.tokens.clone(), "test"))
    })
}

fn has_ident(tokens: TokenStream, name: &str) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == name,
        TokenTree::Group(g) => has_ident(g.stream(), name),
        _ => false,
    })
}

/// Reads one file's uses, relative paths still relative (resolved later,
/// when every module is known).
struct Reader {
    here: ModPath,
    uses: Vec<Use>,
    /// Inside a `pub use` item.
    reexport: bool,
    aliases: Vec<(ModPath, String, ModPath)>,
    /// Inline modules (`mod grpc { … }`) of this file.
    inline: Vec<ModPath>,
}

impl Reader {
    fn use_tree(&mut self, prefix: &mut ModPath, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut full = prefix.clone();
                if name == "self" {
                    let last = full.last().cloned().unwrap_or_default();
                    self.record(full.clone(), Some(last));
                } else {
                    full.push(name.clone());
                    self.record(full, Some(name));
                }
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.record(full, Some(r.rename.to_string()));
            }
            syn::UseTree::Glob(_) => self.record(prefix.clone(), None),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn record(&mut self, path: ModPath, name: Option<String>) {
        if let Some(name) = name {
            self.aliases.push((self.here.clone(), name, path.clone()));
        }
        self.push(path);
    }

    fn push(&mut self, path: ModPath) {
        self.uses.push(Use {
            here: self.here.clone(),
            path,
            reexport: self.reexport,
        });
    }

    /// `crate :: a :: b` and `super :: a` sequences in a macro's tokens.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.macro_tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while j + 2 < tokens.len() + 1 {
                        match (&tokens.get(j), &tokens.get(j + 1), &tokens.get(j + 2)) {
                            (
                                Some(TokenTree::Punct(a)),
                                Some(TokenTree::Punct(b)),
                                Some(TokenTree::Ident(seg)),
                            ) if a.as_char() == ':' && b.as_char() == ':' => {
                                path.push(seg.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if path.len() > 1 {
                        self.push(path);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Reader {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.here.push(m.ident.to_string());
            self.inline.push(self.here.clone());
            syn::visit::visit_item_mod(self, m);
            self.here.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.reexport = !matches!(u.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &u.tree);
        self.reexport = false;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: ModPath = p.segments.iter().map(|s| s.ident.to_string()).collect();
        // Any path of two segments or more: one that starts at a child
        // module (`global::Options`) is resolved like `self::`, the rest
        // (`std::…`, `Self::…`, enum variants) resolve to nothing.
        if segs.len() > 1 {
            self.push(segs);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.macro_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

struct Crate {
    sources: Vec<Source>,
    /// Every module (file or inline) and the file it lives in.
    owner: BTreeMap<ModPath, usize>,
    aliases: BTreeMap<(ModPath, String), ModPath>,
}

impl Crate {
    fn read() -> Self {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        // Binaries (`src/bin`) are crates of their own, on the library.
        files.retain(|f| !f.starts_with(src.join("bin")));
        files.sort();
        let mut sources = Vec::new();
        let mut owner = BTreeMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // prost's output (`src/rls/pb`) is machine-made and private.
            if text.starts_with("// This file is @generated") {
                continue;
            }
            let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let here = module_path(&src, &file);
            let mut reader = Reader {
                here: here.clone(),
                uses: Vec::new(),
                reexport: false,
                aliases: Vec::new(),
                inline: Vec::new(),
            };
            reader.visit_file(&ast);
            owner.insert(here, sources.len());
            for m in &reader.inline {
                owner.insert(m.clone(), sources.len());
            }
            sources.push(Source {
                file: file.strip_prefix(src.parent().unwrap()).unwrap().to_owned(),
                uses: reader.uses,
                aliases: reader.aliases,
            });
        }
        let mut krate = Self {
            sources,
            owner,
            aliases: BTreeMap::new(),
        };
        let mut aliases = BTreeMap::new();
        for s in &krate.sources {
            for (here, name, path) in &s.aliases {
                if let Some(abs) = krate.absolute(here, path) {
                    aliases.insert((here.clone(), name.clone()), abs);
                }
            }
        }
        krate.aliases = aliases;
        krate
    }

    /// `path` as seen from module `here`, made absolute; `None` outside the crate.
    fn absolute(&self, here: &ModPath, path: &ModPath) -> Option<ModPath> {
        let mut out = match path.first()?.as_str() {
            "crate" => Vec::new(),
            "self" => here.clone(),
            "super" => here.clone(),
            first => {
                // `use child::Item` names a child module of `here`.
                let mut child = here.clone();
                child.push(first.to_owned());
                if !self.owner.contains_key(&child) {
                    return None;
                }
                here.clone()
            }
        };
        let mut rest = path.iter().peekable();
        if matches!(path[0].as_str(), "crate" | "self") {
            rest.next();
        }
        while rest.peek().is_some_and(|s| *s == "super") {
            rest.next();
            out.pop()?;
        }
        out.extend(rest.cloned());
        Some(out)
    }

    /// The module that defines what absolute `path` names.
    fn defining(&self, path: &ModPath, depth: usize) -> Option<ModPath> {
        let mut module = Vec::new();
        let mut i = 0;
        while i < path.len() {
            let mut next = module.clone();
            next.push(path[i].clone());
            if self.owner.contains_key(&next) {
                module = next;
                i += 1;
            } else {
                break;
            }
        }
        if i < path.len()
            && depth < 16
            && let Some(target) = self.aliases.get(&(module.clone(), path[i].clone()))
        {
            let mut target = target.clone();
            target.extend(path[i + 1..].iter().cloned());
            if &target != path {
                return self.defining(&target, depth + 1).or(Some(module));
            }
        }
        Some(module)
    }

    /// File-to-file arrows, each with one path that witnesses it. A module
    /// re-exporting its own descendants only wires them: no arrow.
    fn arrows(&self) -> BTreeMap<(usize, usize), String> {
        let mut out = BTreeMap::new();
        for (from, s) in self.sources.iter().enumerate() {
            for u in &s.uses {
                let Some(abs) = self.absolute(&u.here, &u.path) else {
                    continue;
                };
                let Some(def) = self.defining(&abs, 0) else {
                    continue;
                };
                if u.reexport && def.starts_with(&u.here) {
                    continue;
                }
                let to = self.owner[&def];
                if to != from {
                    out.entry((from, to))
                        .or_insert_with(|| format!("crate::{}", abs.join("::")));
                }
            }
        }
        out
    }

    fn top(&self, file: usize) -> String {
        let s = &self.sources[file];
        let here = self.owner.iter().find(|(_, f)| **f == file).unwrap().0;
        here.first()
            .cloned()
            .unwrap_or_else(|| s.file.display().to_string())
    }
}

/// Strongly connected components with more than one member (Tarjan).
fn cycles(n: usize, edges: &BTreeSet<(usize, usize)>) -> Vec<Vec<usize>> {
    struct T<'a> {
        next: Vec<Vec<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        count: usize,
        out: &'a mut Vec<Vec<usize>>,
    }
    fn visit(t: &mut T<'_>, v: usize) {
        t.index[v] = Some(t.count);
        t.low[v] = t.count;
        t.count += 1;
        t.stack.push(v);
        t.on[v] = true;
        for w in t.next[v].clone() {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(i) if t.on[w] => t.low[v] = t.low[v].min(i),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                t.out.push(scc);
            }
        }
    }
    let mut next = vec![Vec::new(); n];
    for &(a, b) in edges {
        next[a].push(b);
    }
    let mut out = Vec::new();
    let mut t = T {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        count: 0,
        out: &mut out,
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    out
}

/// The layers, bottom first, from the ADR's `text` block (top first there).
fn layers() -> Vec<Vec<String>> {
    let adr = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/adr/0015-module-layers.md");
    let text = std::fs::read_to_string(adr).unwrap();
    let block = text
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```text block of layers");
    let mut layers: Vec<Vec<String>> = block
        .lines()
        .filter_map(|l| l.split_once(':').map(|(_, mods)| mods))
        .map(|mods| mods.split_whitespace().map(str::to_owned).collect())
        .collect();
    layers.reverse();
    layers
}

#[test]
fn no_file_imports_itself_through_others() {
    let krate = Crate::read();
    let arrows = krate.arrows();
    let edges: BTreeSet<_> = arrows.keys().copied().collect();
    let found = cycles(krate.sources.len(), &edges);
    let shown: Vec<String> = found
        .iter()
        .map(|scc| {
            let members: BTreeSet<usize> = scc.iter().copied().collect();
            let ties: Vec<String> = arrows
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|((a, b), via)| {
                    let (a, b) = (&krate.sources[*a].file, &krate.sources[*b].file);
                    format!("  {} -> {} ({via})", a.display(), b.display())
                })
                .collect();
            ties.join("\n")
        })
        .collect();
    assert!(
        shown.is_empty(),
        "cycles between files:\n{}",
        shown.join("\n\n")
    );
}

#[test]
fn top_level_modules_only_import_lower_layers() {
    let krate = Crate::read();
    let layers = layers();
    let layer_of = |m: &str| layers.iter().position(|l| l.iter().any(|x| x == m));
    let mut wrong = Vec::new();
    let mut unlisted = BTreeSet::new();
    for ((a, b), via) in krate.arrows() {
        let (ta, tb) = (krate.top(a), krate.top(b));
        if ta == tb {
            continue;
        }
        match (layer_of(&ta), layer_of(&tb)) {
            (Some(la), Some(lb)) if lb <= la => {}
            (Some(_), Some(_)) => wrong.push(format!(
                "  {ta} -> {tb}: {} uses {via}",
                krate.sources[a].file.display()
            )),
            (la, lb) => {
                if la.is_none() {
                    unlisted.insert(ta);
                }
                if lb.is_none() {
                    unlisted.insert(tb);
                }
            }
        }
    }
    for s in 0..krate.sources.len() {
        let t = krate.top(s);
        if t.contains('/') || t.ends_with(".rs") {
            continue; // the crate root wires, it is on no layer
        }
        if layer_of(&t).is_none() {
            unlisted.insert(t);
        }
    }
    assert!(
        unlisted.is_empty(),
        "modules on no layer of docs/adr/0015-module-layers.md: {unlisted:?}"
    );
    assert!(
        wrong.is_empty(),
        "arrows that go up a layer (docs/adr/0015-module-layers.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_sees_arrows_it_must() {
    // Guards the test itself: a reader that found nothing would pass.
    let krate = Crate::read();
    let arrows = krate.arrows();
    let named = |f: &str| {
        krate
            .sources
            .iter()
            .position(|s| s.file == Path::new(f))
            .unwrap_or_else(|| panic!("{f} is read"))
    };
    let service = named("src/rate_limit/service.rs");
    assert!(arrows.keys().any(|(a, _)| *a == service), "{arrows:?}");
    assert!(arrows.len() > 50, "{} arrows", arrows.len());
}

/// Arrows within a layer are allowed, so the layers alone do not keep
/// two modules of one layer from importing each other.
#[test]
fn top_level_modules_form_no_cycle() {
    let krate = Crate::read();
    let mut names: Vec<String> = (0..krate.sources.len()).map(|s| krate.top(s)).collect();
    names.sort();
    names.dedup();
    let index = |m: &str| names.iter().position(|n| n == m).unwrap();
    let mut witness = BTreeMap::new();
    for ((a, b), via) in krate.arrows() {
        let (ta, tb) = (krate.top(a), krate.top(b));
        if ta != tb {
            witness
                .entry((index(&ta), index(&tb)))
                .or_insert_with(|| format!("{} uses {via}", krate.sources[a].file.display()));
        }
    }
    let edges: BTreeSet<_> = witness.keys().copied().collect();
    let found = cycles(names.len(), &edges);
    let shown: Vec<String> = found
        .iter()
        .map(|scc| {
            witness
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .map(|((a, b), via)| format!("  {} -> {}: {via}", names[*a], names[*b]))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert!(
        shown.is_empty(),
        "cycles between modules:\n{}",
        shown.join("\n\n")
    );
}

/// `lib.rs` re-exports the entry points for users; inside the crate each
/// item is imported from its home, so that the root is no hidden hub.
#[test]
fn no_import_goes_through_the_crate_root() {
    let krate = Crate::read();
    let root: ModPath = Vec::new();
    let mut through = Vec::new();
    for s in &krate.sources {
        for u in &s.uses {
            if u.here == root || u.path.first().map(String::as_str) != Some("crate") {
                continue;
            }
            let Some(first) = u.path.get(1) else { continue };
            let module = vec![first.clone()];
            if !krate.owner.contains_key(&module)
                && krate.aliases.contains_key(&(root.clone(), first.clone()))
            {
                through.push(format!("  {}: {}", s.file.display(), u.path.join("::")));
            }
        }
    }
    through.sort();
    through.dedup();
    assert!(
        through.is_empty(),
        "{} imports through the crate root's re-exports; import from the item's module:\n{}",
        through.len(),
        through.join("\n")
    );
}
