//! What every command prints the same way: tables (columns as wide as their widest cell) and the
//! server's errors (`error: STATUS CODE: [FIELD: ]MESSAGE`, on stderr; with `--json`, the error
//! body itself). Everything for stdout goes through `out!`/`outln!`: a reader that went away
//! (`sundial task ls | head -1`) ends the process quietly, as it ends other Unix tools.

use std::io::Write;
use sundial_server::ErrorBody;

/// The exit status of a process whose stdout's reader went away: 128 + SIGPIPE (13), what a shell
/// reports for a tool that SIGPIPE ended.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Writes to stdout, flushed. A broken pipe (the reader closed its end) ends the process at once with
/// [`BROKEN_PIPE_STATUS`] and no message; any other write error is reported on stderr and ends the
/// process with status 1 (`print!` would panic on either).
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE_STATUS);
        }
        drop(out);
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `print!` that ends the process quietly on a broken pipe instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` that ends the process quietly on a broken pipe instead of panicking.
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// A fixed-width table: a header row, then one row per entry; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

/// The one line an API error is printed as.
pub fn error_line(status: u16, body: &ErrorBody) -> String {
    let d = &body.error;
    let mut line = format!("error: {status} {}: ", d.code);
    if let Some(f) = &d.field
        && !d.message.starts_with(&format!("{f}:"))
    {
        line.push_str(&format!("{f}: "));
    }
    line.push_str(&d.message);
    if let Some(id) = d.existing_id
        && !d.message.contains(&id.to_string())
    {
        line.push_str(&format!(" (existing: {id})"));
    }
    line
}

/// Prints an API error on stderr: the line, or with `json` the error body as the server sent it.
pub fn report(status: u16, body: &ErrorBody, json: bool) {
    if json {
        match serde_json::to_string(body) {
            Ok(s) => eprintln!("{s}"),
            Err(_) => eprintln!("{}", error_line(status, body)),
        }
    } else {
        eprintln!("{}", error_line(status, body));
    }
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => outln!("{s}"),
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sundial_server::ErrorDetail;

    #[test]
    fn error_lines_have_one_form() {
        let mut d = ErrorDetail {
            code: "invalid".into(),
            message: "bad cron".into(),
            field: Some("cron".into()),
            index: None,
            existing_id: None,
            state: None,
        };
        let b = ErrorBody { error: d.clone() };
        assert_eq!(error_line(422, &b), "error: 422 invalid: cron: bad cron");
        d.message = "cron: bad".into();
        assert_eq!(
            error_line(422, &ErrorBody { error: d }),
            "error: 422 invalid: cron: bad"
        );
    }

    #[test]
    fn tables_fit_their_widest_cell() {
        let t = table(
            &["ID", "X"],
            &[vec![
                "0197a3c4-0000-7000-8000-000000000000".into(),
                "1".into(),
            ]],
        );
        assert_eq!(
            t,
            "ID                                    X\n0197a3c4-0000-7000-8000-000000000000  1\n"
        );
    }
}
