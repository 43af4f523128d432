//! The `idem` binary: parses the command line and hands it to the library.
#![forbid(unsafe_code)]

use clap::Parser;

/// mimalloc instead of the system allocator: a request allocates and frees
/// many small buffers (headers, JSON, statement arguments), and glibc's
/// malloc took about a tenth of `serve`'s CPU (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    idem::cmd::main(idem::cmd::Cli::parse())
}
