# Sourced by scripts/gpu-check.sh (its variables, run_step, record, tokens_of, peak_of): the
# Llama-3-8B shape (hidden 4096, MLP 14336, 32 heads, 8 KV heads, vocabulary 128256) fine-tuned on
# the one GPU, two ways, each in a device call of its own (`--only offload`, `--only lora`):
#
# offload  c) the full fine-tune with ZeRO-3 and the optimizer offloaded to host memory
#          (DeepSpeed's ZeRO-Offload): the fp32 master weights, Adam's moments and the fp32
#          gradients live in host memory, 16 bytes a parameter. All 32 layers where the host holds
#          that within 85% of its memory, else as many as it holds (the row says how many).
# lora     issue 50: LoRA r 16 on all-linear over the whole 8B base frozen in bf16 (16 GB, no
#          master, gradient or optimizer state), no offload, one process.
#
# Each trains: the held-out loss falls over 8 steps of 2,048 tokens; the row gives tokens/s, the
# GPU peak and the host's (the largest process's RSS). A dry run does both at a toy width on the
# CPU, world 1.

llama_8b() {
  local mode="$1"
  local llama="$logs/llama-8b-$mode" out="$logs/llama-8b-$mode-tuned" text="$logs/finetune.txt"
  local layers=32 seq=2048 steps=8 lr=1e-4 host_kib name
  cat "$root"/docs/*.md "$root"/README.md >"$text"
  rm -rf "$llama" "$out"
  local shape=(--hidden_size 4096 --intermediate_size 14336 --num_attention_heads 32
    --num_key_value_heads 8 --vocab_size 128256 --max_position_embeddings 8192)
  local where_ft=(--nproc_per_node 1) launch tune
  if [ "$mode" = offload ]; then
    host_kib="$(awk '/^MemTotal/ {print $2}' /proc/meminfo)"
    layers="$(python3 -c "
import sys
host = float(sys.argv[1]) * 1024 * 0.85
head, layer = 2 * 128256 * 4096, 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
print(max(1, min(32, int((host / 16 - head) // layer))))" "$host_kib")"
    launch=(--use_deepspeed --zero_stage 3 --offload_optimizer_device cpu --zero3_init_flag true)
    tune=()
    name="zero3 + cpu offload"
  else
    launch=()
    tune=(--lora_r 16 --lora_alpha 32 --lora_target_modules all-linear)
    lr=1e-3  # PEFT's usual range for LoRA (1e-4 to 1e-3): the adapters start at zero
    name="LoRA r 16 all-linear, bf16 base, no offload"
  fi
  if [ "$dry" = 1 ]; then
    shape=(--hidden_size 64 --intermediate_size 224 --num_attention_heads 4 --num_key_value_heads 1
      --vocab_size 256)
    layers=2 seq=128 steps=6 lr=1e-3 where_ft=(--cpu --nproc_per_node 1)
  fi
  name="finetune Llama-3-8B shape ($layers of 32 layers) $name"
  if ! run_step "${mode}_init" 300 "${with_bundle[@]}" "$bin/llama_init" --output_dir "$llama" \
       "${shape[@]}" --num_hidden_layers "$layers" --dtype bf16 --max_file_bytes 5000000000 ||
     ! run_step "finetune_$mode" 420 python3 -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
print("host peak %.1f GiB" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20))
sys.exit(rc)' "${with_bundle[@]}" "$bin/cxxlaunch" run "${where_ft[@]}" "${launch[@]}" \
       --mixed_precision bf16 \
       "$bin/finetune" --model_dir "$llama" --data "$text" --seq_len "$seq" --batch_size 1 \
       --lr "$lr" --eval_fraction 0.01 --steps "$steps" --print_every 2 --save_steps 0 \
       "${tune[@]}" --output_dir "$out"; then
    record FAIL "$name" "$logs/${mode}_init.log, $logs/finetune_$mode.log"
    return
  fi
  local log="$logs/finetune_$mode.log" first last verdict  # the held-out loss before and after
  first="$(grep -o 'eval loss [0-9.]* perplexity [0-9.]*  (before' "$log" | awk '{print $3}')"
  last="$(grep -o 'eval loss [0-9.]* perplexity [0-9.]*  (after' "$log" | awk '{print $3}')"
  verdict="$(python3 -c "import sys; print('PASS' if float(sys.argv[2]) < float(sys.argv[1]) else 'FAIL')" "$first" "$last" 2>&1)"
  record "$verdict" "$name" "eval loss $first -> $last, $(tokens_of "$log") tokens/s, GPU peak $(peak_of "$log"), $(grep -o 'host peak [0-9.]* GiB' "$log")"
  rm -rf "$llama" "$out"  # tens of GB
}
