// Shared by the unit tests of lowbit-optim and lowbit-model (`include!`d): reads an integer
// constant of a kernel file, so a test can hold the Rust launcher's value against the CUDA
// side's without nvcc (CI has none). A change on either side alone then fails `cargo test`.

/// The integer value of `name` in the kernel source `src`: `#define NAME 123` (a trailing
/// `//` comment allowed) or `NAME = 123` inside an `enum { ... }` line. Panics naming the
/// constant when it is missing or not a plain integer (the test then fails loudly).
fn header_value(src: &str, name: &str) -> i64 {
    let parse = |v: &str| v.trim().trim_end_matches(['u', 'U']).parse::<i64>().ok();
    for line in src.lines() {
        let code = line.split("//").next().unwrap_or("");
        if let Some(rest) = code.trim().strip_prefix("#define ") {
            let mut parts = rest.splitn(2, char::is_whitespace);
            if parts.next() == Some(name) {
                return parts.next().and_then(parse).unwrap_or_else(|| panic!("#define {name}: not an integer in {line:?}"));
            }
        } else if code.trim_start().starts_with("enum") {
            let body = code.split(['{', '}']).nth(1).unwrap_or("");
            for item in body.split(',') {
                if let Some((n, v)) = item.split_once('=') {
                    if n.trim() == name {
                        return parse(v).unwrap_or_else(|| panic!("enum {name}: not an integer in {line:?}"));
                    }
                }
            }
        }
    }
    panic!("no #define or enum value {name} in the kernel source")
}
