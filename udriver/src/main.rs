fn main() {
    eprintln!("udriver: not wired yet");
    std::process::exit(2);
}
