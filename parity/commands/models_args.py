"""`parity models list|build|synth`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, models.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import Parser, runs


def register(sub) -> None:
    models = sub.add_parser("models", help="list, build or synthesize models")
    models_sub = models.add_subparsers(dest="models_command", required=True, parser_class=Parser)
    models_sub.add_parser("list", help="the model zoo and what is available here")
    build = models_sub.add_parser("build", help="train an embedded tiny pair into parity/assets/")
    build.add_argument("--pair", default="tiny-llama3-eagle", choices=["tiny-llama3-eagle", "tiny-llama3-eagle3"],
                       help="which embedded pair (tiny-llama3-eagle3 reuses tiny-llama3-eagle's target)")
    build.add_argument("--out", default=None, help="folder (default parity/assets/<pair>)")
    synth = models_sub.add_parser("synth", help="write a random-weights target + EAGLE head with a chosen acceptance")
    synth.add_argument("--shape", required=True,
                       help="llama3-8b, llama3-1b, tiny, or llama3-70b with --at-load (see docs/models.md)")
    synth.add_argument("--head", required=True,
                       help="eagle1, eagle3, mtp-deepseek or mtp-qwen3next (the published layouts; docs/mtp.md)")
    synth.add_argument("--mtp-layers", type=int, default=1,
                       help="MTP heads: num_nextn_predict_layers, one layer per draft position (default 1: reused)")
    synth.add_argument("--acceptance", type=float, default=0.8,
                       help="share of positions where the target's greedy token is the draft's (0..1, default 0.8)")
    synth.add_argument("--peak", type=float, default=None,
                       help="the draft's mean top-1 probability to calibrate the logit scale to (0: none; default "
                            "0.6 for the llama3 shapes, none for tiny; docs/tree.md)")
    synth.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 (default) or float16")
    synth.add_argument("--out", required=True, help="a new (or empty) folder for target/, the head and synth_info.json")
    synth.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    synth.add_argument("--hybrid-every", type=int, default=0, metavar="N",
                       help="a hybrid target: every Nth layer a recurrent (Mamba2-like) mixer (docs/hybrid.md)")
    synth.add_argument("--hybrid", dest="hybrid_every", action="store_const", const=2,
                       help="a hybrid target with every 2nd layer recurrent (--hybrid-every 2)")
    synth.add_argument("--device", default="auto", help="where weights are made and calibrated: auto, cpu or cuda")
    synth.add_argument("--at-load", action="store_true",
                       help="write configs, tokenizer and the recipe only: every run draws the weights on its device "
                            "at load, each TP rank its slices (a 70B pair; docs/tp.md); not calibrated")
    synth.add_argument("--scale", type=float, default=None,
                       help="--at-load: the target's o_proj/down_proj scale (default 1e-4)")
    models.set_defaults(handler=runs("models"))
