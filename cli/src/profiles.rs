//! `primus profiles`: list the model cards and hardware profiles the catalog knows.

use super::{CliError, Common, Output, catalog, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let c = catalog(&args.common)?;
    match args.output {
        Output::Json => {
            let models: Vec<_> = c.models().collect();
            let hardware: Vec<_> = c.hardware_profiles().collect();
            print_json(&serde_json::json!({"models": models, "hardware": hardware}))
        }
        Output::Table => {
            println!(
                "{:<20} {:>7} {:>8} {:>6} {:>9}",
                "MODEL", "LAYERS", "HIDDEN", "HEADS", "EXPERTS"
            );
            for m in c.models() {
                let experts = m.moe.as_ref().map(|e| e.num_experts).unwrap_or(0);
                println!(
                    "{:<20} {:>7} {:>8} {:>6} {:>9}",
                    m.name, m.layers, m.hidden_size, m.attention_heads, experts
                );
            }
            println!();
            println!(
                "{:<12} {:<28} {:>9} {:>9} {:>8} {:>10} {:<16}",
                "GPU", "PRODUCT", "BF16 TF", "FP8 TF", "HBM GiB", "GPUs/node", "RESOURCE"
            );
            for h in c.hardware_profiles() {
                println!(
                    "{:<12} {:<28} {:>9.0} {:>9.0} {:>8.0} {:>10} {:<16}",
                    h.name,
                    h.product,
                    h.peak_tflops.bf16,
                    h.peak_tflops.fp8,
                    h.memory_gib,
                    h.gpus_per_node,
                    h.kubernetes.resource
                );
            }
            Ok(())
        }
    }
}
