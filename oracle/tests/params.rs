//! Parameter counts of every preset model card, against the exact count derived by hand from
//! the model's public config.json (derivation in each test), and within 2% of the rounded
//! figure its authors publish.

use primus_oracle::model::{LayerKind, ModelCard};
use primus_oracle::profiles::Catalog;

fn card(name: &str) -> ModelCard {
    Catalog::builtin()
        .expect("built-in catalog")
        .model(name)
        .unwrap_or_else(|| panic!("preset {name}"))
        .clone()
}

fn within(actual: u64, published: f64, tolerance: f64) {
    let rel = (actual as f64 - published).abs() / published;
    assert!(
        rel <= tolerance,
        "{actual} is {:.2}% away from the published {published}",
        rel * 100.0
    );
}

// Llama-style dense layer: attention h*a*d (Q) + 2*h*g*d (K, V) + a*d*h (O), SwiGLU MLP
// 3*h*f, two RMSNorms 2*h. Model: embedding V*h + layers + final norm h + untied output V*h.

#[test]
fn llama2_7b() {
    // h 4096, a = g = 32, d 128, f 11008, V 32000, 32 layers.
    // attention 4*4096^2 = 67,108,864; MLP 3*4096*11008 = 135,266,304; norms 8,192
    // layer 202,383,360 x 32 = 6,476,267,520; embeddings 2*32000*4096 = 262,144,000; norm 4,096
    let c = card("llama2-7b");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 202_383_360);
    assert_eq!(c.total_params(), 6_738_415_616);
    assert_eq!(c.active_params(), c.total_params());
    within(c.total_params(), 6.74e9, 0.02);
}

#[test]
fn llama2_70b() {
    // h 8192, a 64, g 8, d 128, f 28672, V 32000, 80 layers.
    // attention 2*8192^2 + 2*8192*1024 = 150,994,944; MLP 3*8192*28672 = 704,643,072;
    // norms 16,384; layer 855,654,400 x 80 = 68,452,352,000; embeddings 2*32000*8192 =
    // 524,288,000; norm 8,192.
    let c = card("llama2-70b");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 855_654_400);
    assert_eq!(c.total_params(), 68_976_648_192);
    within(c.total_params(), 70e9, 0.02);
}

#[test]
fn llama3_1_8b() {
    // h 4096, a 32, g 8, d 128, f 14336, V 128256, 32 layers.
    // attention 2*4096^2 + 2*4096*1024 = 41,943,040; MLP 3*4096*14336 = 176,160,768; norms
    // 8,192; layer 218,112,000 x 32 = 6,979,584,000; embeddings 2*128256*4096 =
    // 1,050,673,152; norm 4,096.
    let c = card("llama3.1-8b");
    assert_eq!(c.total_params(), 8_030_261_248);
    within(c.total_params(), 8.03e9, 0.02);
}

#[test]
fn llama3_1_70b() {
    // As Llama 2 70B with V 128256: layers 68,452,352,000; embeddings 2*128256*8192 =
    // 2,101,346,304; norm 8,192.
    let c = card("llama3.1-70b");
    assert_eq!(c.total_params(), 70_553_706_496);
    within(c.total_params(), 70.6e9, 0.02);
}

#[test]
fn llama3_1_405b() {
    // h 16384, a 128, g 8, d 128, f 53248, V 128256, 126 layers.
    // attention 2*16384^2 + 2*16384*1024 = 570,425,344; MLP 3*16384*53248 = 2,617,245,696;
    // norms 32,768; layer 3,187,703,808 x 126 = 401,650,679,808; embeddings 2*128256*16384 =
    // 4,202,692,608; norm 16,384.
    let c = card("llama3.1-405b");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 3_187_703_808);
    assert_eq!(c.total_params(), 405_853_388_800);
    within(c.total_params(), 405e9, 0.02);
}

#[test]
fn mixtral_8x7b() {
    // h 4096, a 32, g 8, d 128, 8 experts of f 14336, top-2, V 32000, 32 layers.
    // attention 41,943,040; expert 3*4096*14336 = 176,160,768; router 8*4096 = 32,768;
    // norms 8,192. Layer: 41,943,040 + 8*176,160,768 + 32,768 + 8,192 = 1,451,270,144.
    // Total 32 layers + 2*32000*4096 + 4096 = 46,702,792,704.
    // Active layer: 41,943,040 + 2*176,160,768 + 40,960 = 394,305,536; x 32 + 262,148,096.
    let c = card("mixtral-8x7b");
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 1_451_270_144);
    assert_eq!(c.total_params(), 46_702_792_704);
    assert_eq!(c.active_params(), 12_879_925_248);
    within(c.total_params(), 46.7e9, 0.02);
    within(c.active_params(), 12.9e9, 0.02);
}

#[test]
fn mixtral_8x22b() {
    // h 6144, a 48, g 8, d 128, 8 experts of f 16384, top-2, V 32768, 56 layers.
    // attention 2*6144^2 + 2*6144*1024 = 88,080,384; expert 3*6144*16384 = 301,989,888;
    // router 49,152; norms 12,288. Layer 88,080,384 + 8*301,989,888 + 61,440 =
    // 2,504,060,928; x 56 = 140,227,411,968; + 2*32768*6144 = 402,653,184; + 6,144.
    // Active layer 88,080,384 + 2*301,989,888 + 61,440 = 692,121,600; x 56 + 402,659,328.
    let c = card("mixtral-8x22b");
    assert_eq!(c.total_params(), 140_630_071_296);
    assert_eq!(c.active_params(), 39_161_468_928);
    within(c.total_params(), 141e9, 0.02);
    within(c.active_params(), 39e9, 0.02);
}

#[test]
fn qwen3_30b_a3b() {
    // h 2048, a 32, g 4, d 128 (head_dim), 128 experts of f 768, top-8, V 151936, 48 layers.
    // attention 2048*4096 + 2*2048*512 + 4096*2048 + q/k norms 2*128 = 18,874,624;
    // expert 3*2048*768 = 4,718,592; router 128*2048 = 262,144; norms 4,096.
    // Layer 18,874,624 + 128*4,718,592 + 262,144 + 4,096 = 623,120,640; x 48 =
    // 29,909,790,720; + 2*151936*2048 = 622,329,856; + 2,048.
    // Active layer 18,874,624 + 8*4,718,592 + 266,240 = 56,889,600; x 48 + 622,331,904.
    let c = card("qwen3-30b-a3b");
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 623_120_640);
    assert_eq!(c.total_params(), 30_532_122_624);
    assert_eq!(c.active_params(), 3_353_032_704);
    within(c.total_params(), 30.5e9, 0.02);
    within(c.active_params(), 3.3e9, 0.02);
}

#[test]
fn qwen3_235b_a22b() {
    // h 4096, a 64, g 4, d 128, 128 experts of f 1536, top-8, V 151936, 94 layers.
    // attention 4096*8192 + 2*4096*512 + 8192*4096 + 256 = 71,303,424; expert 3*4096*1536 =
    // 18,874,368; router 128*4096 = 524,288; norms 8,192.
    // Layer 71,303,424 + 128*18,874,368 + 532,480 = 2,487,755,008; x 94 = 233,849,970,752;
    // + 2*151936*4096 = 1,244,659,712; + 4,096.
    // Active layer 71,303,424 + 8*18,874,368 + 532,480 = 222,830,848; x 94 + 1,244,663,808.
    let c = card("qwen3-235b-a22b");
    assert_eq!(c.total_params(), 235_093_634_560);
    assert_eq!(c.active_params(), 22_190_763_520);
    within(c.total_params(), 235e9, 0.02);
    within(c.active_params(), 22e9, 0.02);
}

#[test]
fn deepseek_v3() {
    // h 7168, 128 heads, MLA q_lora 1536, kv_lora 512, d_nope 128, d_rope 64, d_v 128.
    // Attention: q_a 7168*1536 = 11,010,048 + q_a norm 1,536 + q_b 1536*128*192 = 37,748,736
    // + kv_a 7168*576 = 4,128,768 + kv_a norm 512 + kv_b 512*128*256 = 16,777,216 + o
    // 128*128*7168 = 117,440,512 = 187,107,328. Norms 14,336.
    // Dense layer (3): + 3*7168*18432 = 396,361,728 -> 583,483,392.
    // MoE layer (58): 256 experts + 1 shared of 3*7168*2048 = 44,040,192 each; router
    // 256*7168 = 1,835,008 + correction bias 256 -> 187,107,328 + 14,336 + 257*44,040,192 +
    // 1,835,264 = 11,507,286,272.
    // Total 3*583,483,392 + 58*11,507,286,272 + 2*129280*7168 + 7,168 = 671,026,419,200.
    // Active MoE layer: 187,107,328 + 14,336 + 9*44,040,192 + 1,835,264 = 585,318,656;
    // total active 1,750,450,176 + 58*585,318,656 + 1,853,365,248 = 37,552,297,472.
    // MTP module: an MoE layer + 3 norms 21,504 + eh_proj 2*7168^2 = 102,760,448.
    let c = card("deepseek-v3");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 583_483_392);
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 11_507_286_272);
    assert_eq!(c.total_params(), 671_026_419_200);
    assert_eq!(c.active_params(), 37_552_297_472);
    assert_eq!(c.mtp_layer_params(), 11_610_068_224);
    assert_eq!(c.total_params_with_mtp(), 682_636_487_424);
    within(c.total_params(), 671e9, 0.02);
    within(c.active_params(), 37e9, 0.02);
}

#[test]
fn kimi_k2() {
    // DeepSeek-V3's layer shapes with 64 heads, 384 experts and one dense layer.
    // Attention: q_a 7168*1536 = 11,010,048 + q_a norm 1,536 + q_b 1536*64*192 = 18,874,368
    // + kv_a 7168*576 = 4,128,768 + kv_a norm 512 + kv_b 512*64*256 = 8,388,608 + o
    // 64*128*7168 = 58,720,256 = 101,124,096. Norms 14,336.
    // Dense layer (1): + 3*7168*18432 = 396,361,728 -> 497,500,160.
    // MoE layer (60): 384 experts + 1 shared of 3*7168*2048 = 44,040,192 each; router
    // 384*7168 = 2,752,512 + correction bias 384 -> 101,124,096 + 14,336 + 385*44,040,192 +
    // 2,752,896 = 17,059,365,248.
    // Total 497,500,160 + 60*17,059,365,248 + 2*163840*7168 + 7,168 = 1,026,408,232,448.
    // Active MoE layer: 101,124,096 + 14,336 + 9*44,040,192 + 2,752,896 = 500,253,056;
    // total active 497,500,160 + 60*500,253,056 + 2,348,817,408 = 32,861,500,928.
    let c = card("kimi-k2");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 497_500_160);
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 17_059_365_248);
    assert_eq!(c.total_params(), 1_026_408_232_448);
    assert_eq!(c.active_params(), 32_861_500_928);
    within(c.total_params(), 1.04e12, 0.02);
    within(c.active_params(), 32.6e9, 0.02);
}

#[test]
fn deepseek_v2_lite() {
    // h 2048, 16 heads, MLA without q_lora, kv_lora 512, d_nope 128, d_rope 64, d_v 128.
    // Attention: q 2048*16*192 = 6,291,456 + kv_a 2048*576 = 1,179,648 + kv_a norm 512 +
    // kv_b 512*16*256 = 2,097,152 + o 16*128*2048 = 4,194,304 = 13,763,072. Norms 4,096.
    // Dense layer (1): + 3*2048*10944 = 67,239,936 -> 81,007,104.
    // MoE layer (26): 64 experts + 2 shared of 3*2048*1408 = 8,650,752 each = 570,949,632;
    // router 64*2048 = 131,072 (softmax, no bias) -> 584,847,872.
    // Total 81,007,104 + 26*584,847,872 + 2*102400*2048 + 2,048 = 15,706,484,224.
    // Active MoE layer: 13,767,168 + 8*8,650,752 + 131,072 = 83,104,256; total active
    // 81,007,104 + 26*83,104,256 + 419,430,400 + 2,048 = 2,661,150,208; without the
    // embedding lookup 2,451,435,008 (DeepSeek's "2.4B activated").
    let c = card("deepseek-v2-lite");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 81_007_104);
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 584_847_872);
    assert_eq!(c.total_params(), 15_706_484_224);
    assert_eq!(c.active_params(), 2_661_150_208);
    within(c.total_params(), 15.7e9, 0.02);
    within(c.active_params_without_embedding_lookup(), 2.4e9, 0.025);
}

#[test]
fn deepseek_v2() {
    // h 5120, 128 heads, MLA q_lora 1536, kv_lora 512, qk 128 + rope 64, v 128, 160 routed
    // experts and 2 shared of f 1536, top-6, dense FFN 12288 (1 layer), V 102400, 60 layers.
    // MLA: q_down 5120*1536 = 7,864,320 + q_norm 1,536 + q_up 1536*128*192 = 37,748,736 +
    // kv_down 5120*576 = 2,949,120 + kv_norm 512 + kv_up 512*128*256 = 16,777,216 + o
    // 128*128*5120 = 83,886,080 = 149,227,520. Layer norms 2*5120 = 10,240.
    // Dense layer: + 3*5120*12288 = 188,743,680 -> 337,981,440.
    // MoE layer (59): 162 experts of 3*5120*1536 = 23,592,960 = 3,822,059,520; router
    // 160*5120 = 819,200 -> 3,972,116,480.
    // Total 337,981,440 + 59*3,972,116,480 + 2*102400*5120 + 5,120 = 235,741,434,880 ("236B").
    // Active MoE layer: 149,237,760 + 8*23,592,960 + 819,200 = 338,800,640; total active
    // 337,981,440 + 59*338,800,640 + 1,048,576,000 + 5,120 = 21,375,800,320; without the
    // embedding lookup 20,851,512,320 (DeepSeek's "21B activated").
    let c = card("deepseek-v2");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 337_981_440);
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 3_972_116_480);
    assert_eq!(c.total_params(), 235_741_434_880);
    assert_eq!(c.active_params(), 21_375_800_320);
    within(c.total_params(), 236e9, 0.01);
    within(c.active_params_without_embedding_lookup(), 21e9, 0.01);
}

#[test]
fn moonlight_16b_a3b() {
    // DeepSeek-V2-Lite's shapes with a dense FFN of 11264, a sigmoid router with its
    // correction bias (64), and vocabulary 163840.
    // Dense layer: 13,763,072 + 4,096 + 3*2048*11264 = 69,206,016 -> 82,973,184.
    // MoE layer: 13,763,072 + 4,096 + 570,949,632 + 131,072 + 64 = 584,847,936.
    // Total 82,973,184 + 26*584,847,936 + 2*163840*2048 + 2,048 = 15,960,110,208 ("16B").
    // Active: 82,973,184 + 26*83,104,320 + 671,088,640 + 2,048 = 2,914,776,192 ("3B").
    let c = card("moonlight-16b-a3b");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 82_973_184);
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 584_847_936);
    assert_eq!(c.total_params(), 15_960_110_208);
    assert_eq!(c.active_params(), 2_914_776_192);
    within(c.total_params(), 16e9, 0.02);
    within(c.active_params(), 3e9, 0.03);
}

#[test]
fn gpt_oss_120b() {
    // h 2880, a 64, g 8, d 64, 128 experts of f 2880, top-4, V 201088, 36 layers, biases.
    // Attention: q 2880*4096 + 4096, k and v 2880*512 + 512 each, o 4096*2880 + 2880, sinks
    // 64 = 26,550,144. Expert: gate/up 2880*5760 + 5760, down 2880*2880 + 2880 = 24,891,840.
    // Router 128*2880 + 128 = 368,768. Norms 5,760.
    // Layer 26,550,144 + 128*24,891,840 + 368,768 + 5,760 = 3,213,080,192; x 36 =
    // 115,670,886,912; + 2*201088*2880 = 1,158,266,880; + 2,880 = 116,829,156,672.
    // Active layer 26,550,144 + 4*24,891,840 + 374,528 = 126,492,032; x 36 + 1,158,269,760 =
    // 5,711,982,912; without the embedding lookup (OpenAI's convention) 5,132,849,472.
    let c = card("gpt-oss-120b");
    assert_eq!(c.layer_params(LayerKind::Moe).total(), 3_213_080_192);
    assert_eq!(c.total_params(), 116_829_156_672);
    assert_eq!(c.active_params(), 5_711_982_912);
    assert_eq!(c.active_params_without_embedding_lookup(), 5_132_849_472);
    within(c.total_params(), 116.8e9, 0.02);
    within(c.active_params_without_embedding_lookup(), 5.1e9, 0.02);
}

// Megatron GPT layer: QKV 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h, two LayerNorms 4h:
// 12h^2 + 13h (Narayanan et al. 2021, eq. for P). Model: (V + 2048 positions)*h tied
// embedding, final LayerNorm 2h.

#[test]
fn gpt_22b() {
    // h 6144: layer 12*6144^2 + 13*6144 = 453,064,704; x 48 = 21,747,105,792;
    // (51200 + 2048)*6144 = 327,155,712; + 12,288.
    let c = card("gpt-22b");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 453_064_704);
    assert_eq!(c.total_params(), 22_074_273_792);
    within(c.total_params(), 22e9, 0.02);
}

#[test]
fn gpt3_175b() {
    // h 12288: layer 1,812,099,072; x 96 = 173,961,510,912; 53248*12288 = 654,311,424;
    // + 24,576.
    let c = card("gpt3-175b");
    assert_eq!(c.total_params(), 174_615_846_912);
    within(c.total_params(), 175e9, 0.02);
}

#[test]
fn gpt_530b() {
    // h 20480: layer 5,033,431,040; x 105 = 528,510,259,200; 53248*20480 = 1,090,519,040;
    // + 40,960.
    let c = card("gpt-530b");
    assert_eq!(c.total_params(), 529_600_819_200);
    within(c.total_params(), 530e9, 0.02);
}

#[test]
fn gpt_1t() {
    // h 25600: layer 7,864,652,800; x 128 = 1,006,675,558,400; 53248*25600 =
    // 1,363,148,800; + 51,200.
    let c = card("gpt-1t");
    assert_eq!(c.total_params(), 1_008_038_758_400);
    within(c.total_params(), 1e12, 0.02);
}

#[test]
fn mcore_ci_gpt_7b() {
    // Megatron-LM's CI memory-test GPT (gpt3_7b_*_memory_speed), a GQA variant of the Megatron
    // GPT layer: h 4096, a 32, g 8, d 128, f 16384. Q h*a*d = 16,777,216; K, V 2*h*g*d =
    // 8,388,608; QKV bias (a + 2g)*d = 6,144; O 16,777,216 + 4,096; MLP 2*h*f = 134,217,728 +
    // 20,480; two LayerNorms 16,384: 176,207,872 per layer, x 32 = 5,638,651,904. Untied:
    // (131073 + 8192 positions)*4096 = 570,429,440 embedding, 131073*4096 = 536,875,008 output,
    // final LayerNorm 8,192. Its "7b" is the test's label, not a published count: no `within`.
    let c = card("mcore-ci-gpt-7b");
    assert_eq!(c.layer_params(LayerKind::Dense).total(), 176_207_872);
    assert_eq!(c.total_params(), 6_745_964_544);
}

#[test]
fn every_preset_has_a_test() {
    let names = Catalog::builtin().unwrap().model_names().len();
    assert_eq!(
        names, 20,
        "a new preset needs its own parameter-count test here"
    );
}
