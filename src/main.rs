//! The `nodekeeper` binary: the only place with argument parsing, runtimes, printing and exit
//! codes. The product is `nodekeeper-core`; the stand-ins (sim, demo) are `nodekeeper-sim`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
