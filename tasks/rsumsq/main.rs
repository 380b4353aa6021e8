//! rsumsq N: the sum of i*i for i in [0, N), modulo 2^64, printed on stdout;
//! N is written to /out/n.txt. It reports progress and checkpoints (i and
//! the sum so far, 16 bytes little-endian) whenever one is due, and resumes
//! from the latest: docs/TASK_ABI.md's Go example, in Rust through the
//! cyclepool crate.
use std::convert::TryInto;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 2 {
        eprintln!("usage: rsumsq N");
        std::process::exit(2);
    }
    let n: u64 = args[1].parse().expect("N");
    let (mut i, mut sum) = (0u64, 0u64);
    if let Some(st) = cyclepool::restore() {
        if st.len() == 16 {
            i = u64::from_le_bytes(st[..8].try_into().unwrap());
            sum = u64::from_le_bytes(st[8..].try_into().unwrap());
        }
    }
    while i < n {
        sum = sum.wrapping_add(i.wrapping_mul(i));
        if i % 1_000_000 == 0 {
            cyclepool::progress(i as f64 / n as f64);
            if cyclepool::checkpoint_due() {
                let mut st = Vec::with_capacity(16);
                st.extend_from_slice(&(i + 1).to_le_bytes());
                st.extend_from_slice(&sum.to_le_bytes()); // the state after step i
                let _ = cyclepool::checkpoint(&st); // a refusal is not fatal
            }
        }
        i += 1;
    }
    println!("{}", sum);
    std::fs::write("/out/n.txt", &args[1]).expect("/out/n.txt");
}
