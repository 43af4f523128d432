//! The `idem` binary: parses the command line and hands it to the library.
#![forbid(unsafe_code)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    idem::cli::main(idem::cli::Cli::parse())
}
