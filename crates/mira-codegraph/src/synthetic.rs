//! A generated workspace for the code graph benchmark and tests: many small files in four
//! languages that call each other.

use std::path::Path;

/// Writes a generated workspace of `n` files: packages of 100 files each, Rust, Python,
/// TypeScript and Go in turn, each file with a few definitions calling a neighbour.
pub fn generate_workspace(root: &Path, n: usize) -> std::io::Result<()> {
    for i in 0..n {
        let pkg = format!("pkg{:04}", i / 100);
        let dir = root.join(&pkg);
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir)?;
        }
        let j = (i + 1) % n.max(1);
        let (name, body) = match i % 4 {
            0 => (
                format!("m{i}.rs"),
                format!(
                    "pub struct S{i};\nimpl S{i} {{\n    pub fn run(&self) -> u64 {{ f{j}() }}\n}}\npub fn f{i}() -> u64 {{ {i} }}\n"
                ),
            ),
            1 => (
                format!("m{i}.py"),
                format!("class C{i}:\n    def run(self):\n        return f{j}()\n\ndef f{i}():\n    return {i}\n"),
            ),
            2 => (
                format!("m{i}.ts"),
                format!(
                    "export class C{i} {{ run(): number {{ return f{j}(); }} }}\nexport function f{i}(): number {{ return {i}; }}\n"
                ),
            ),
            _ => (
                format!("m{i}.go"),
                format!(
                    "package {pkg}\n\ntype T{i} struct{{}}\n\nfunc (t *T{i}) Run() int {{ return F{j}() }}\n\nfunc F{i}() int {{ return {i} }}\n"
                ),
            ),
        };
        std::fs::write(dir.join(name), body)?;
    }
    Ok(())
}
