fn main() -> anyhow::Result<()> {
    xtask_run::main()
}
