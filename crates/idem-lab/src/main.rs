//! The `idem-lab` binary: parses the command line and hands it to the library.
#![forbid(unsafe_code)]

use clap::Parser;

/// The allocator the `idem` binary uses, so that the `idem serve` processes
/// the lab starts from this binary run as deployed ones do.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    idem_lab::cmd::main(idem_lab::cmd::Cli::parse())
}
