fn main() -> std::process::ExitCode {
    nodekeeper::cli::main()
}
