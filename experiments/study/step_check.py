"""Check one GRPO batch by hand: advantages, the gradient, and how far along it the policy still improves.

For one prompt and an SFT'd policy directory: sample ``G`` responses (temperature 1, the HF engine),
score them, compute group-normalised advantages, the GRPO loss (:func:`shared_interfaces.losses.regime_loss`,
token-mean, ratio 1 at the snapshot), its gradient (per parameter tensor: norm against the tensor's own norm),
then the exact probability of the reference response after a step of a given *parameter-space norm* along
the normalised direction of (a) the whole PG gradient, (b) its positive-advantage rows only (an SFT step
on the group's successes), (c) its negative rows only. It prints the norm of Adam's first step at a few
learning rates beside (Adam's first update is ``lr * sign(g)`` for every parameter: norm ``lr * sqrt(#params)``).

    python -m experiments.study.step_check --policy DIR/seed0/sft400/llama-sub --question "What is 5-0?" --gold 5
"""

from __future__ import annotations

import argparse
import copy
import math

import torch

from mrl_llm.batch import response_layout
from mrl_llm.logprobs import forward_logprobs, pack
from mrl_llm.models import load_policy
from mrl_llm.rewards import arithmetic_reward
from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.templates import PromptTemplate, TemplateConfig
from shared_interfaces.losses import regime_loss
from shared_interfaces.regimes.config import LossConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True, help="an SFT'd policy directory")
    ap.add_argument("--question", required=True)
    ap.add_argument("--gold", required=True)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model, tok, meta = load_policy(args.policy)
    tpl = PromptTemplate(TemplateConfig(**meta["template"]), tok)
    from mrl_llm.data.problem import Problem

    prob = Problem(prompt_id="check", question=args.question, gold=args.gold, verifier="arithmetic")
    prompt = list(tok(tpl.render(prob), add_special_tokens=tpl.add_special_tokens).input_ids)
    samples = HFEngine(model, tok).generate([prompt], args.group_size, SamplingConfig(max_new_tokens=12))[0]
    resp = [list(s.token_ids) for s in samples]
    rew = torch.tensor([arithmetic_reward(s.text, args.gold, finish_reason=s.finish_reason) for s in samples],
                       dtype=torch.float64)
    adv = (rew - rew.mean()) / (rew.std() + 1e-6)
    print("samples:", [s.text for s in samples])
    print("rewards:", rew.tolist(), " advantages:", [round(a, 3) for a in adv.tolist()])
    if float(rew.std()) == 0.0:
        print("every sample has the same reward: zero advantages, no gradient; try another --seed")
        return
    packed = pack([prompt] * len(resp), resp, tok.pad_token_id)
    ref_ids = list(tok(tpl.render(prob) + f"\\boxed{{{args.gold}}}", add_special_tokens=tpl.add_special_tokens)
                   .input_ids)[len(prompt):] + [tok.eos_token_id]
    ref_pack = pack([prompt], [ref_ids], tok.pad_token_id)

    def p_ref(m: torch.nn.Module) -> float:
        with torch.no_grad():
            lp, _ = forward_logprobs(m, ref_pack, 1.0)
            return math.exp(float(response_layout(lp, ref_pack)[0].sum()))

    def direction(rows: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad()
        lp, mask = response_layout(forward_logprobs(model, packed, 1.0)[0], packed)
        a = torch.where(rows, adv, torch.zeros_like(adv))
        regime_loss(lp, lp.detach(), a, mask, LossConfig(clip_low=0.2, clip_high=0.28, agg="token-mean")).loss.backward()
        g = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return g

    g = direction(adv == adv)
    total = math.sqrt(sum(float((x ** 2).sum()) for x in g.values()))
    params = dict(model.named_parameters())
    print(f"PG gradient norm {total:.3f}; largest tensors (grad norm / parameter norm):")
    for n, x in sorted(g.items(), key=lambda kv: -float(kv[1].norm()))[:5]:
        print(f"  {n:45s} {float(x.norm()):.3f} / {float(params[n].detach().norm()):.3f}")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"Adam's first-step norm (lr * sqrt(#params = {n_params})): "
          + ", ".join(f"lr {lr:g}: {lr * math.sqrt(n_params):.3f}" for lr in (1e-5, 3e-5, 1e-4, 3e-4)))
    print(f"p(reference response) at the start: {p_ref(model):.4f}")
    norms = (0.001, 0.003, 0.01, 0.03, 0.1)
    print("p(reference) after a step of norm " + " / ".join(f"{s:g}" for s in norms) + ":")
    for name, rows in (("PG (all rows)", adv == adv), ("positive rows", adv > 0), ("negative rows", adv < 0)):
        d = direction(rows)
        nrm = math.sqrt(sum(float((x ** 2).sum()) for x in d.values()))
        out = []
        for step in norms:
            m2 = copy.deepcopy(model)
            with torch.no_grad():
                for n, p in m2.named_parameters():
                    if n in d:
                        p -= step * d[n] / nrm
            out.append(f"{p_ref(m2):.4f}")
        print(f"  {name:14s} " + " / ".join(out))


if __name__ == "__main__":
    main()
