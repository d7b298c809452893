fn main() {
    eprintln!("device-model: not wired yet");
    std::process::exit(2);
}
