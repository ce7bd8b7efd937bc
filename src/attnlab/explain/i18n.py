# ruff: noqa: E501  (Chinese characters count double; the catalogue keeps each message on its own lines)
"""``attnlab explain``'s table of the one catalogue (:mod:`attnlab.i18n`): every string it shows, in English and Chinese.

Key -> ``(english, chinese)``, registered into :data:`attnlab.i18n.MESSAGES`; :func:`tr` picks a language and fills
the ``{fields}`` (the lab reuses these keys for what explain computes). The Chinese uses the articles' own terms (查询、键、值、分数、权重、因果遮罩、温度、缩放、行和 …);
symbols and identifiers (Q, K, V, W_O, d_k, softmax, exp, nan) stay as they are.

>>> tr("label.weights", "zh")
'权重'
>>> tr("cli.error", "en", prog="attnlab explain", msg="bad")
'attnlab explain: error: bad'
"""

from __future__ import annotations

from ..i18n import LANGS, MESSAGES, TERMS, check_lang, register, tr

__all__ = ["LANGS", "MESSAGES", "TERMS", "check_lang", "tr"]

_M: dict[str, tuple[str, str]] = {
    # ---- CLI and renderers
    "cli.error": ("{prog}: error: {msg}", "{prog}：错误：{msg}"),
    "cli.need_input": (
        "give a named example (see --list) or your matrices with --q, --k and --v",
        "请给出一个命名示例（见 --list），或用 --q、--k、--v 给出矩阵",
    ),
    "cli.masked_rows_hint": (
        " (on the command line: --masked-rows zero or --masked-rows nan)",
        "（命令行：--masked-rows zero 或 --masked-rows nan）",
    ),
    "cli.causal_hint": (
        "on the command line: --causal-align top_left or --causal-align bottom_right",
        "命令行：--causal-align top_left 或 --causal-align bottom_right",
    ),
    "cli.needs_qk": (
        "{flag} needs Q and K; the example {name!r} does not start from them",
        "{flag} 需要 Q 和 K；示例 {name!r} 不从它们出发",
    ),
    "cli.one_of": ("{a} and {b}: give one of them", "{a} 与 {b}：只能给其中一个"),
    "render.options": ("Options: {opts}", "选项：{opts}"),
    "render.note": ("Note: {text}", "注：{text}"),
    "render.source": ("Source: {source}", "出处：{source}"),
    "render.mistake": ("Mistake {name}: {title}", "错误 {name}：{title}"),
    "render.right_weights": ("right weights", "正确的权重"),
    "render.wrong_weights": ("wrong weights ({name})", "错误的权重（{name}）"),
    "render.row_sums": ("row sums: right {right}; wrong {wrong}", "行和：正确 {right}；错误 {wrong}"),
    "render.wrong_row_sums": ("wrong row sums: {sums}", "错误的行和：{sums}"),
    "render.right_output": ("right output", "正确的输出"),
    "render.wrong_output": ("wrong output", "错误的输出"),
    "render.why": ("Why: {text}", "原因：{text}"),
    "render.article": ("article {source}", "文章 {source}"),
    "opt.causal": ("causal", "因果"),
    "opt.causal_align": ("causal ({align})", "因果（{align}）"),
    "opt.padding": ("padding={n} ({side})", "填充={n}（{side}）"),
    "opt.mask": ("mask", "遮罩"),
    "opt.bias": ("bias", "偏置"),
    "opt.scale": ("scale={x}", "缩放={x}"),
    "opt.shift": ("shift={x}", "平移={x}"),
    "opt.temperature": ("temperature={x}", "温度={x}"),
    "opt.masked_rows": ("masked_rows={x}", "全遮罩行策略={x}"),
    "side.right": ("right", "右侧"),
    "side.left": ("left", "左侧"),
    "label.weights": ("weights", "权重"),
    "label.max": ("max", "max"),
    "label.sum": ("sum", "行和"),
    "label.your_matrices": ("Your matrices", "你的矩阵"),
    "list.line": ("{name:<18} {title}  [article {source}]", "{name:<18} {title}  [文章 {source}]"),
}

_M.update(
    {
        # ---- steps.py: one attention computation
        "step.inputs.title": ("Inputs", "输入"),
        "step.inputs.cross": (
            "n_q={n_q} != n_k={n_k}: A is [n_q, n_k], not square. In cross attention the queries come from one "
            "sequence and the keys/values from another (001 §2.2); in decoding one new query reads the cached keys "
            "(001 §14). Self attention takes Q, K, V from the same X.",
            "n_q={n_q} ≠ n_k={n_k}：A 的形状是 [n_q, n_k]，不必是方阵。Cross-Attention 中查询来自一个序列，键和值来自"
            "另一个序列（001 §2.2）；生成时一个新查询读取缓存的键（001 §14）。Self-Attention 中 Q、K、V 都来自同一个 X。",
        ),
        "step.scores.title": ("Scores: every query against every key", "分数：每个查询与每个键做点积"),
        "step.scores.row_sum": ("row {r}: sum of scores = {s}", "第 {r} 行：分数之和 = {s}"),
        "step.scores.more": ("({n} more entries computed the same way)", "（其余 {n} 个元素同样计算）"),
        "step.scores.note": (
            "A dot product is not a probability: scores can be any real number, negative too, and a row need not "
            "sum to 1. They are logits; softmax turns them into weights (001 §3.1).",
            "点积不是概率：分数可以是任意实数，包括负数，每行之和也不必为 1。它们只是 logits，Softmax 之后才是权重"
            "（001 §3.1）。",
        ),
        "step.scale.title": ("Scale", "缩放"),
        "step.scale.given": (
            "scale = {s} (given; the default would be 1/sqrt({d}) = {x})",
            "scale = {s}（给定；默认应为 1/sqrt({d}) = {x}）",
        ),
        "step.scale.note": (
            "Dividing by sqrt(d_k) keeps the scores' spread near 1 whatever d_k is, so softmax does not saturate "
            "(the experiment: attnlab explain variance).",
            "除以 sqrt(d_k) 使分数的尺度在任何 d_k 下都接近 1，避免 softmax 过早饱和（实验：attnlab explain variance）。",
        ),
        "step.shift.title": ("Add a constant to every score", "给每个分数加同一个常数"),
        "step.shift.note": (
            "Softmax subtracts each row's max, so the same constant on a whole row changes no weight.",
            "softmax 会减去每行的最大值，所以对整行统一平移不会改变任何权重。",
        ),
        "step.bias.title": ("Add the bias", "加上偏置"),
        "step.bias.columns": (
            "A different bias per column (key) changes the weights: softmax is invariant only to one constant on a "
            "whole row (000, self-test).",
            "给不同列（键）加不同偏置会改变权重：softmax 只对同一行的统一平移不变（000 自测）。",
        ),
        "step.bias.rowconst": (
            "The same bias on every key of a row changes no weight (softmax ignores a shift of a whole row).",
            "同一行的所有键加相同偏置不改变权重（softmax 对整行平移不变）。",
        ),
        "step.bias.note": (
            "An additive bias (ALiBi, relative positions) is added to the scaled scores before the mask and softmax.",
            "加性偏置（ALiBi、相对位置）加在缩放后的分数上，在遮罩和 softmax 之前。",
        ),
        "step.temperature.title": ("Divide by the temperature", "除以温度"),
        "step.temperature.note": (
            "T > 1 pulls the scores together (flatter weights); T < 1 spreads them (sharper weights).",
            "T > 1 把分数拉近（权重更平均）；T < 1 把分数拉开（权重更尖锐）。",
        ),
        "step.mask.title": ("Mask: blocked entries become -inf", "遮罩：被屏蔽的位置置为 -inf"),
        "step.mask.formula": (
            "x_ij = -inf where query i may not attend to key j",
            "查询 i 不能关注键 j 的位置：x_ij = -inf",
        ),
        "step.mask.causal": ("causal (query i sees keys j <= i)", "因果遮罩（查询 i 只看键 j <= i）"),
        "step.mask.causal_align": (
            "causal, {align} (query i sees keys j <= i + {shift})",
            "因果遮罩，{align}（查询 i 只看键 j <= i + {shift}）",
        ),
        "step.mask.padding": (
            "padding ({n} real key(s), padded on the {side})",
            "填充（{n} 个真实键，填充在{side}）",
        ),
        "step.mask.yours": ("your mask", "你的遮罩"),
        "step.mask.and": (" AND ", " 且 "),
        "step.mask.note": (
            "Mask = {what}. ■ may attend, ⬚ blocked. Masking happens BEFORE softmax.",
            "遮罩 = {what}。■ 允许关注，⬚ 屏蔽。遮罩在 softmax 之前施加。",
        ),
        "step.max.title": ("Row maximum over the legal keys", "合法键上的行最大值"),
        "step.max.line": ("m[{r}] = max of {vals} = {m}", "m[{r}] = {vals} 的 max = {m}"),
        "step.max.none": ("m[{r}]: no legal key", "m[{r}]：没有合法的键"),
        "step.max.note": (
            "Subtracting it changes nothing in the result but keeps exp from overflowing (stable softmax).",
            "减去它不改变结果，但能避免 exp 溢出（稳定 softmax）。",
        ),
        "step.exp.title": ("Exponentials", "指数"),
        "step.exp.raw": (
            "(without subtracting the max: exp = {raw}, sum {sum}: the same weights {w})",
            "（不减最大值：exp = {raw}，和 {sum}：权重相同 {w}）",
        ),
        "step.exp.overflow": (
            "(without subtracting the max: exp({x}) = inf, an overflow (float64 overflows above {lim}); inf / inf = "
            "nan: every weight of this row would be nan)",
            "（不减最大值：exp({x}) = inf，溢出（float64 超过 {lim} 就溢出）；inf / inf = nan：这一行的权重全部变成 "
            "nan）",
        ),
        "step.exp.underflow": (
            "(without subtracting the max: every exp of this row underflows to 0 (float64 exp is 0 below {lim}); "
            "0 / 0 = nan: every weight of this row would be nan)",
            "（不减最大值：这一行的每个 exp 都下溢为 0（float64 的 exp 低于 {lim} 就是 0）；0 / 0 = nan：这一行的权重全部变成 "
            "nan）",
        ),
        "step.exp.note": (
            "The largest legal entry of each row becomes exp(0) = 1; masked entries are exactly 0.",
            "每行最大的合法项变成 exp(0) = 1；被屏蔽的项恰好为 0。",
        ),
        "step.sum.title": ("Row sums", "行和"),
        "step.weights.title": ("Weights (softmax)", "权重（softmax）"),
        "step.weights.row_sum": ("row {r}: sum of weights = {s}", "第 {r} 行：权重之和 = {s}"),
        "step.weights.note": (
            "Each legal row sums to 1; masked keys get exactly 0.",
            "每个合法行的和为 1；被屏蔽的键权重恰好为 0。",
        ),
        "step.weights.note_empty": (
            "Row(s) {rows} have no legal key at all: softmax is 0/0 there (see the masked-rows policy).",
            "第 {rows} 行没有任何合法的键：softmax 是 0/0（见全遮罩行的处理策略）。",
        ),
        "step.output.title": ("Output: weighted sum of the values", "输出：值的加权和"),
        "step.output.none": ("o[{r}] = 0 (no legal key)", "o[{r}] = 0（没有合法的键）"),
        "step.output.note": (
            "The weights say where to read from; the values say what is read.",
            "权重决定“读多少、从哪里读”，值决定“读到什么”。",
        ),
        "step.note.masked_rows": (
            "Fully masked row(s) {rows}: softmax over no key is 0/0. Policy {policy}: ",
            "全遮罩行 {rows}：对空集合做 softmax 是 0/0。策略 {policy}：",
        ),
        "step.note.policy_zero": (
            "weights and output set to 0, as FlashAttention does.",
            "权重和输出置为 0，与 FlashAttention 相同。",
        ),
        "step.note.policy_nan": ("NaN, as naive code gives.", "NaN，与朴素实现的结果相同。"),
        "step.note.pad_query": (
            "Only the PAD keys are masked: a PAD query still gets an output. Whether it matters depends on what "
            "follows (is PAD ignored in the loss, cleared before pooling?): masking keys does not make PAD queries "
            "invalid, and masking only queries would let real tokens read PAD values (001 §7.1, §17.4).",
            "只屏蔽了 PAD 键：PAD 查询仍然有输出。它是否有影响取决于后续实现（损失是否忽略 PAD、池化前是否清除）："
            "只屏蔽键不等于自动让 PAD 查询的输出无效；而只屏蔽查询则会让有效 token 读到 PAD 的值（001 §7.1、§17.4）。",
        ),
        "step.wavg.inputs": ("Inputs: given weights and values", "输入：给定的权重和值"),
        "step.wavg.note": (
            "Attention computes these weights from Q and K instead of fixing them.",
            "Attention 的权重不是固定参数，而是由 Q 与 K 的匹配动态计算出来的。",
        ),
        "step.logits.title": ("Logits", "logits（未归一化分数）"),
        # ---- lessons.py
        "lesson.variance.step": (
            "The experiment: {n} pairs q, k with independent N(0, 1) entries (seed {seed})",
            "实验：{n} 对 q、k，各分量独立服从 N(0, 1)（随机种子 {seed}）",
        ),
        "lesson.variance.line": (
            "d_k={d}: Var(q·k) = {v} ≈ d_k, std {sd} ≈ sqrt(d_k) = {r}; Var(q·k/sqrt(d_k)) = {s} ≈ 1",
            "d_k={d}：Var(q·k) = {v} ≈ d_k，标准差 {sd} ≈ sqrt(d_k) = {r}；Var(q·k/sqrt(d_k)) = {s} ≈ 1",
        ),
        "lesson.variance.note": (
            "Each term q_r k_r has mean 0 and variance 1, so the sum of d_k of them has variance d_k and standard "
            "deviation sqrt(d_k); dividing by sqrt(d_k) brings the variance back to 1 for every d_k.",
            "每一项 q_r k_r 的期望为 0、方差约为 1，d_k 项独立相加后方差约为 d_k、标准差约为 sqrt(d_k)；除以 "
            "sqrt(d_k) 后，无论 d_k 多大，方差都回到 1。",
        ),
        "lesson.variance.sat_step": (
            "What it does to softmax: the largest of 16 weights, on average over 500 queries",
            "对 softmax 的影响：16 个权重中的最大值（500 个查询的平均）",
        ),
        "lesson.variance.col_unscaled": ("max weight, q·k", "最大权重，q·k"),
        "lesson.variance.col_scaled": ("max weight, q·k/√d_k", "最大权重，q·k/√d_k"),
        "lesson.variance.sat_line": (
            "d_k={d}: unscaled {u}, scaled {s}",
            "d_k={d}：未缩放 {u}，缩放后 {s}",
        ),
        "lesson.variance.sat_note": (
            "Unscaled, the logits grow like sqrt(d_k) and softmax saturates toward one-hot (its gradients vanish); "
            "scaled, the spread of the weights does not depend on d_k.",
            "不缩放时 logits 按 sqrt(d_k) 增大，softmax 趋于 one-hot（梯度变小）；缩放后权重的分布与 d_k 无关。",
        ),
        "lesson.variance.caveat": (
            "A motive from initialisation and numerical stability, not a theorem about every trained model (000, 001 "
            "§4.2).",
            "这是初始化与数值稳定的动机，不是任意训练后分布都严格满足的定理（000、001 §4.2）。",
        ),
        "lesson.overflow.naive": ("Without subtracting the max", "不减最大值"),
        "lesson.overflow.naive_line": (
            "exp([1000, 999]) = {raw}: overflow; {raw} / inf = {w}",
            "exp([1000, 999]) = {raw}：溢出；{raw} / inf = {w}",
        ),
        "lesson.overflow.naive_note": (
            "e^1000 is larger than any float64 (the largest is about e^709.78), so it becomes inf and inf / inf is "
            "nan. The stable softmax below subtracts the row max first: softmax(x) = softmax(x - c).",
            "e^1000 大于任何 float64（最大约为 e^709.78），于是变成 inf，而 inf / inf 是 nan。下面的稳定 softmax 先减去"
            "行最大值：softmax(x) = softmax(x - c)。",
        ),
        "lesson.overflow.limits": ("Where exp overflows, per dtype", "各数据类型中 exp 的溢出点"),
        "lesson.overflow.limits_note": (
            "With the max subtracted every exponent is <= 0, so the largest exp is 1 in every dtype; without it, "
            "float16 already overflows at a logit of 11.1 and float32 at 88.7.",
            "减去最大值后所有指数的输入都不大于 0，最大的 exp 为 1；不减时 float16 在 logit 为 11.1 时就溢出，float32 "
            "在 88.7。",
        ),
        "lesson.fp16.fills": ("The fill value, stored in float32 and float16", "填充值在 float32 与 float16 中的存储"),
        "lesson.fp16.fill_line": ("{f}: float32 {a}, float16 {b}", "{f}：float32 {a}，float16 {b}"),
        "lesson.fp16.overflow": (
            "  <- overflow: float16's largest magnitude is 65504",
            "  <- 溢出：float16 的最大绝对值是 65504",
        ),
        "lesson.fp16.fills_note": (
            "-1e9 is 'small enough' in float32 but does not exist in float16: the cast gives -inf. -1e4 fits in both.",
            "-1e9 在 float32 中“足够小”，但 float16 表示不了它：转换后变成 -inf。-1e4 在两者中都能表示。",
        ),
        "lesson.fp16.causal": (
            "The 2×2 causal example with fill -1e9, in float32 and in float16",
            "用 -1e9 填充的 2×2 因果示例，分别在 float32 与 float16 中",
        ),
        "lesson.fp16.causal_line": (
            "both give [[1, 0], [0.33, 0.67]] (float16 keeps about 3 digits): a row with a legal key is safe either way",
            "两者都得到 [[1, 0], [0.33, 0.67]]（float16 只保留约 3 位有效数字）：有合法键的行不受影响",
        ),
        "lesson.fp16.causal_note": (
            "In float16 the -1e9 silently became -inf; the weights are right here only because each row still has "
            "a legal key.",
            "在 float16 中 -1e9 已悄悄变成 -inf；这里权重正确，只是因为每一行仍有合法的键。",
        ),
        "lesson.fp16.empty": (
            "A fully masked row [fill, fill]: the fill decides the result",
            "全遮罩行 [填充值, 填充值]：结果取决于填充值",
        ),
        "lesson.fp16.empty_line": (
            "float32 with -1e9: [0.5, 0.5], the row silently reads every key; float16 with -1e9 (now -inf) and -inf: "
            "nan",
            "float32 中用 -1e9：[0.5, 0.5]，这一行悄悄读取了所有键；float16 中的 -1e9（已成 -inf）以及 -inf：nan",
        ),
        "lesson.fp16.empty_note": (
            "The same code gives a silent wrong average in float32 and NaN in float16. attnlab uses a boolean mask "
            "and a named policy for fully masked rows (masked_rows: raise, zero, nan), never a fill value.",
            "同一段代码在 float32 中给出悄无声息的错误平均，在 float16 中给出 NaN。attnlab 使用布尔遮罩，并为全遮罩行"
            "规定明确的策略（masked_rows：raise、zero、nan），从不依赖填充值。",
        ),
        "lesson.self.base": ("The weights of the four-position causal example", "四个位置因果示例的权重"),
        "lesson.self.shift": ("+100 on every legal score", "每个合法分数都加 100"),
        "lesson.self.diff": (
            "largest change of a weight: {d}",
            "权重的最大变化：{d}",
        ),
        "lesson.self.shift_note": (
            "Mathematically nothing changes: softmax is invariant to the same shift of a whole row. Implementations "
            "subtract the max first, so exp does not overflow either.",
            "数学上不会改变：softmax 对同一行的统一平移不变。实现通常先减去最大值，所以 exp 也不会溢出。",
        ),
        "lesson.self.column": ("A different bias per column: b = {b}", "给不同列加不同偏置：b = {b}"),
        "lesson.self.column_note": (
            "Now the weights change: a per-column bias is not a shift of the row. Try it: attnlab explain causal-4 "
            "--bias 0,1,2,3.",
            "这时权重改变了：按列的偏置不是整行平移。试一试：attnlab explain causal-4 --bias 0,1,2,3。",
        ),
        "lesson.mh.shapes": (
            "The shapes of a real layer (000: d_model 512, 8 heads of 64)",
            "真实层的形状（000：d_model 512，8 个头，每头 64）",
        ),
        "lesson.mh.shapes_note": (
            "The scale is 1/sqrt(d_head) = 1/8, not 1/sqrt(d_model) (001 §10.2; attnlab explain 2x2 --mistake "
            "sqrt-d-model). softmax runs over the last axis, the keys.",
            "缩放因子是 1/sqrt(d_head) = 1/8，而不是 1/sqrt(d_model)（001 §10.2；attnlab explain 2x2 --mistake "
            "sqrt-d-model）。softmax 沿最后一个维度（键）进行。",
        ),
        "lesson.mh.project": ("Project: one X, three weight matrices", "投影：同一个 X，三组权重矩阵"),
        "lesson.mh.split": ("Split into heads", "拆成多个头"),
        "lesson.mh.split_line": (
            "head {r}: columns {a}..{b} of Q, K and V (d_head = {w})",
            "第 {r} 个头：Q、K、V 的第 {a}..{b} 列（d_head = {w}）",
        ),
        "lesson.mh.head": ("Head {r}: attention in its own subspace", "第 {r} 个头：在自己的子空间中做 Attention"),
        "lesson.mh.head_line": (
            "scale = 1/sqrt(d_head) = 1/sqrt({w}) = {s} (not 1/sqrt(d_model) = 1/sqrt({dm}) = {bad})",
            "scale = 1/sqrt(d_head) = 1/sqrt({w}) = {s}（不是 1/sqrt(d_model) = 1/sqrt({dm}) = {bad}）",
        ),
        "lesson.mh.concat": ("Concatenate the heads", "拼接各头"),
        "lesson.mh.concat_note": (
            "The heads read differently because their projections differ; sharing one W_Q, W_K, W_V and copying the "
            "result would add nothing (001 §10.3).",
            "各头读取的内容不同，是因为它们的投影参数不同；如果共享同一组 W_Q、W_K、W_V 再复制结果，多头不会带来任何"
            "多样性（001 §10.3）。",
        ),
        "lesson.mh.w_o": ("Output projection W_O: mix the heads", "输出投影 W_O：跨头混合"),
        "lesson.mh.check": (
            "the same as attnlab.multi_head_attention (largest difference {d})",
            "与 attnlab.multi_head_attention 的结果相同（最大差 {d}）",
        ),
        "lesson.mh.w_o_note": (
            "Without W_O each head would stay in its own block of columns; W_O mixes them back to d_model. A head's "
            "role (syntax, coreference) is not given: it has to be tested by experiment (000).",
            "没有 W_O 时各头只能停留在拼接后的固定分块中；W_O 把它们混合回 d_model。某个头的作用（语法、指代）不是"
            "预先规定的，需要实验验证（000）。",
        ),
        "lesson.bw.title": ("{title}: the backward pass by hand", "{title}：手算反向传播"),
        "lesson.bw.forward": ("Forward, and the upstream gradient G_O", "前向结果与上游梯度 G_O"),
        "lesson.bw.dv": ("Gradient of V", "对 V 的梯度"),
        "lesson.bw.dv_note": (
            "A value that is read more gets more gradient.",
            "被关注得越多的值，得到的梯度通常越大。",
        ),
        "lesson.bw.da": ("Gradient of the weights A", "对权重 A 的梯度"),
        "lesson.bw.ds": ("Through softmax: the row Jacobian", "穿过 softmax：逐行 Jacobian"),
        "lesson.bw.ds_note": (
            "delta is each row's rowsum(dA ∘ A); masked entries (A = 0) get exactly 0 gradient.",
            "delta 是每行的 rowsum(dA ∘ A)；被屏蔽的位置（A = 0）梯度恰好为 0。",
        ),
        "lesson.bw.dq": ("Gradient of Q", "对 Q 的梯度"),
        "lesson.bw.dk": ("Gradient of K", "对 K 的梯度"),
        "lesson.bw.check": ("Checks", "校验"),
        "lesson.bw.check_line": (
            "largest difference: {a} from attnlab.attention_backward, {f} from a central finite difference",
            "最大差：与 attnlab.attention_backward 相差 {a}，与中心有限差分相差 {f}",
        ),
        "lesson.bw.check_note": (
            "L = sum(G_O ∘ O), so ∂L/∂O = G_O; the finite difference moves one entry by ±1e-6 and runs the forward "
            "again.",
            "L = sum(G_O ∘ O)，因此 ∂L/∂O = G_O；有限差分把每个元素移动 ±1e-6 再重新计算前向。",
        ),
        "lesson.do.title": ("{title}: dropout on the weights", "{title}：对权重做 Dropout"),
        "lesson.do.weights": ("The weights A (softmax after the mask)", "权重 A（遮罩后的 softmax）"),
        "lesson.do.keep": (
            "The dropout mask: each weight kept with probability 1 - p (p = {p}, seed {seed})",
            "Dropout 掩码：每个权重以概率 1 - p 保留（p = {p}，随机种子 {seed}）",
        ),
        "lesson.do.keep_note": ("■ kept, ⬚ dropped.", "■ 保留，⬚ 丢弃。"),
        "lesson.do.dropped": ("Inverted dropout", "反向缩放的 Dropout（inverted dropout）"),
        "lesson.do.row_sum": ("row {r}: sum = {s}", "第 {r} 行：行和 = {s}"),
        "lesson.do.dropped_note": (
            "After inverted dropout the rows no longer sum to 1, and that is not a bug (001 §18). The weights "
            "attnlab returns (multi_head_attention(...).weights) are the ones before dropout.",
            "反向缩放的 Dropout（inverted dropout）之后行和不再等于 1，这不是实现错误（001 §18）。attnlab 返回的权重"
            "（multi_head_attention(...).weights）是 Dropout 之前的权重。",
        ),
        "lesson.do.output": ("The output with dropout", "有 Dropout 时的输出"),
        "lesson.do.output_note": (
            "A mask forbids connections by structure, at training and inference; dropout drops them at random, in "
            "training only.",
            "Mask 是结构性禁止连接，推理时仍然存在；Dropout 是训练时随机丢弃部分连接，推理时关闭。",
        ),
        "lesson.do.mean": ("On average over 20,000 masks", "20,000 个掩码的平均"),
        "lesson.do.mean_line": ("largest |mean - A| = {d}", "最大 |平均 - A| = {d}"),
        "lesson.do.mean_note": (
            "The 1 / (1 - p) makes the expectation equal to A, so evaluation needs no rescaling.",
            "1 / (1 - p) 的缩放让期望等于 A，所以推理时不需要再缩放。",
        ),
        "lesson.growth.step": ("Elements of the T×T score matrix", "T×T 分数矩阵的元素个数"),
        "lesson.growth.line": (
            "1,024 -> 4,096 tokens: {a} -> {b} elements, {r}x (4x the length)",
            "1,024 -> 4,096 个 token：{a} -> {b} 个元素，{r} 倍（长度 4 倍）",
        ),
        "lesson.growth.note": (
            "The count explains the pressure of long contexts; latency also depends on batch, memory access and "
            "the kernel, so an end-to-end service is not simply 16x slower (000).",
            "这个数量关系解释了长上下文的压力；但延迟还受 batch、内存访问和内核实现影响，不能简单断言端到端服务也慢 16 "
            "倍（000）。",
        ),
        "lesson.cost.flops": (
            "FLOPs and memory of one layer, d_model 512, 8 heads, float32",
            "单层的 FLOPs 与内存，d_model 512，8 个头，float32",
        ),
        "lesson.cost.cross": (
            "the n² term overtakes the projections at n ≈ {n}",
            "当 n ≈ {n} 时 n² 项超过投影项",
        ),
        "lesson.cost.flops_note": (
            "Small n: the d_model² projections dominate; large n: the n² scores do. FlashAttention avoids storing the "
            "n×n matrix; it does not make exact attention linear (001 §13.4).",
            "n 较小时投影的 d_model² 项占主导；n 很大时 n² 项成为瓶颈。FlashAttention 避免显式保存 n×n 矩阵，"
            "但并没有让精确 Attention 变成线性复杂度（001 §13.4）。",
        ),
        "lesson.cost.heads": ("More heads at the same d_model (001 §15)", "相同 d_model 下增加头数（001 §15）"),
        "lesson.cost.heads_line": (
            "n = 1,024: Q Kᵀ + A V = {a} FLOPs with 8 heads of 64, {b} with 16 heads of 32",
            "n = 1,024：8 个头（每头 64）时 Q Kᵀ + A V = {a} FLOPs，16 个头（每头 32）时为 {b}",
        ),
        "lesson.cost.heads_note": (
            "The same FLOPs, because each head gets narrower; shapes, kernels and the KV cache layout still differ.",
            "FLOPs 相同，因为每个头变窄了；但张量形状、内核和 KV Cache 的布局仍然不同。",
        ),
        "lesson.cost.kv": ("KV cache size (001 §14)", "KV Cache 大小（001 §14）"),
        "lesson.cost.kv_note": (
            "The 2 is one cache for K and one for V. Decoding reads the whole cache at every step: O(L d_k) per "
            "token, O(T² d_model) for T tokens.",
            "最后的 2 来自键和值两份缓存。生成时每一步都要读取整个缓存：每个 token 为 O(L d_k)，T 个 token 总计 "
            "O(T² d_model)。",
        ),
        "lesson.cost.formula": (
            "O(B n d_model²) + O(B n² d_model);  memory O(B h n²)",
            "O(B n d_model²) + O(B n² d_model)；内存 O(B h n²)",
        ),
        "lesson.cost.col_proj": ("GFLOP proj", "投影 GFLOP"),
        "lesson.cost.col_mem": ("MiB scores", "分数矩阵 MiB"),
        "lesson.cost.kv_formula": (
            "B · L · layers · h_kv · d_head · 2 · bytes",
            "B · L · 层数 · h_kv · d_head · 2 · 字节数",
        ),
        "lesson.cost.kv_gqa": (
            "1 · 4096 · 32 · 8 · 128 · 2 · 2 B = {x} MiB (GQA, 8 KV heads)",
            "1 · 4096 · 32 · 8 · 128 · 2 · 2 字节 = {x} MiB（GQA，8 个 KV 头）",
        ),
        "lesson.cost.kv_mha": (
            "1 · 4096 · 32 · 32 · 128 · 2 · 2 B = {x} MiB (MHA, 32 KV heads)",
            "1 · 4096 · 32 · 32 · 128 · 2 · 2 字节 = {x} MiB（MHA，32 个 KV 头）",
        ),
        "lesson.bw.check_formula": (
            "|by hand - attention_backward|,  |by hand - (L(x+ε) - L(x-ε)) / 2ε|",
            "|手算 - attention_backward|，|手算 - (L(x+ε) - L(x-ε)) / 2ε|",
        ),
        "lesson.bw.fd": ("finite difference", "有限差分"),
        "lesson.fp16.empty_formula": ("softmax([fill, fill])", "softmax([填充值, 填充值])"),
        "lesson.fp16.fills_formula": ("float32(fill), float16(fill)", "float32(填充值)，float16(填充值)"),
        "lesson.access.secret": ("secret", "秘密"),
        "lesson.access.weights": (
            "Causal mask, and b may not see the secret: the weights",
            "因果遮罩，且 b 不可见秘密：权重",
        ),
        "lesson.access.zero": ("b's weight on the secret: {w}", "b 对秘密的权重：{w}"),
        "lesson.access.layers": (
            "The secret's value [1, 0] -> [100, 0]: how far each output moves after one and two layers",
            "把秘密的值从 [1, 0] 改为 [100, 0]：一层和两层之后每个输出的变化",
        ),
        "lesson.access.col1": ("1 layer", "1 层"),
        "lesson.access.col2": ("2 layers", "2 层"),
        "lesson.access.line": (
            "b moves {one} after one layer and {two} after two",
            "b 在一层后变化 {one}，两层后变化 {two}",
        ),
        "lesson.access.via": (
            "the path b <- a <- secret: A[b, a] · A[a, secret] · 99 = {a} · {b} · 99 = {x}",
            "路径 b <- a <- 秘密：A[b, a] · A[a, 秘密] · 99 = {a} · {b} · 99 = {x}",
        ),
        "lesson.access.note": (
            "The mask removed one connection of one forward pass; the secret still reached b through a. A mask is a "
            "computation constraint, not a security boundary.",
            "遮罩只删除了一次前向计算中的一条连接；秘密仍然经由 a 到达 b。模型内的 Mask 是计算约束，不是安全边界。",
        ),
        "lesson.access.where": (
            "Permissions belong in retrieval, server-side authorisation and context assembly: a document the user may "
            "not read must never enter the context (001 §17.5).",
            "权限必须在数据检索、服务端授权和上下文组装阶段完成：用户无权访问的文档根本不能进入上下文（001 §17.5）。",
        ),
        "lesson.long.step": ("From 4,096 to 8,192 tokens", "从 4,096 到 8,192 个 token"),
        "lesson.long.row0": ("full: n² score elements", "全连接：n² 个分数元素"),
        "lesson.long.row1": ("causal: n(n+1)/2 pairs", "因果：n(n+1)/2 个连接"),
        "lesson.long.row2": ("causal window of {w} keys", "{w} 个键的因果滑动窗口"),
        "lesson.long.row3": ("KV cache MiB, MHA (32 KV heads)", "KV Cache MiB，MHA（32 个 KV 头）"),
        "lesson.long.row4": ("KV cache MiB, GQA (8 KV heads)", "KV Cache MiB，GQA（8 个 KV 头）"),
        "lesson.long.row5": ("KV cache MiB, MQA (1 KV head)", "KV Cache MiB，MQA（1 个 KV 头）"),
        "lesson.long.line": (
            "4,096 -> 8,192: {full}x the score elements, {win}x with a window of {w} keys, {kv}x the KV cache",
            "4,096 -> 8,192：分数矩阵元素 {full} 倍，{w} 个键的窗口 {win} 倍，KV Cache {kv} 倍",
        ),
        "lesson.long.gqa": (
            "GQA (8 KV heads) {g}x smaller, MQA {m}x (32 layers, d_head 128, float16)",
            "GQA（8 个 KV 头）缩小 {g} 倍，MQA 缩小 {m} 倍（32 层，d_head 128，float16）",
        ),
        "lesson.long.note": (
            "A window or sparse attention drops connections and linear attention changes the kernel: they are not "
            "the same function as full attention. FlashAttention is: the same exact result, in O(n) memory "
            "(attnlab explain causal-4 --tiled 2).",
            "窗口或稀疏 Attention 删除了部分连接，线性 Attention 改变了核函数：它们与标准全连接 Attention 不是同一个函数。"
            "FlashAttention 是：结果完全相同，内存 O(n)（attnlab explain causal-4 --tiled 2）。",
        ),
        "lesson.long.measure": (
            "Measure at the same quality: end-to-end latency (not one kernel), peak memory, the degradation as n "
            "grows, and empty, very long and fully masked inputs (001 §19).",
            "在相同质量目标下测量：端到端延迟（而不只是单个 Kernel）、峰值显存、长度增长时的退化，以及空输入、超长输入和"
            "全 Mask 输入的行为（001 §19）。",
        ),
        "lesson.inv.step": (
            "Cross attention, 2 queries and 3 keys, key k2 masked for q0: the weights",
            "Cross-Attention，2 个查询、3 个键，q0 看不到键 k2：权重",
        ),
        "lesson.inv.shape": ("shape(Q Kᵀ) = [n_q, n_k] = {s}", "shape(Q Kᵀ) = [n_q, n_k] = {s}"),
        "lesson.inv.masked": (
            "masked A_ij = 0: max |A_ij| over masked (i, j) = {x}",
            "被屏蔽的 A_ij = 0：被屏蔽位置上 max |A_ij| = {x}",
        ),
        "lesson.inv.sums": ("valid rows sum to 1: {s}", "有效查询行的和为 1：{s}"),
        "lesson.inv.agg": ("O = A V: {ok}", "O = A V：{ok}"),
        "lesson.inv.yes": ("holds (max |O - A V| <= 1e-12)", "成立（max |O - A V| <= 1e-12）"),
        "lesson.inv.no": ("does not hold", "不成立"),
        "lesson.inv.dk": ("d_k(Q) = d_k(K): {a} = {b}", "d_k(Q) = d_k(K)：{a} = {b}"),
        "lesson.inv.nk": ("n_k(K) = n_k(V): {a} = {b}", "n_k(K) = n_k(V)：{a} = {b}"),
        "lesson.inv.check": ("attnlab.invariants.check: {n} violations", "attnlab.invariants.check：{n} 处违反"),
        "lesson.inv.note": (
            "Shape, mask, normalisation, aggregation and matrix product: check them again after every optimisation, "
            "mixed precision or kernel swap, not only the final loss or throughput (001 §21).",
            "形状、Mask、归一化、聚合和矩阵乘法：每次优化、混合精度或替换内核之后都要重新检查，不能只看最终 loss 或吞吐（001 §21）。",
        ),
        "lesson.leak.masks": ("The causal mask, right and inverted", "因果遮罩：正确与写反"),
        "lesson.leak.right": ("right (j <= i):", "正确（j <= i）："),
        "lesson.leak.wrong": ("inverted (j >= i):", "写反（j >= i）："),
        "lesson.leak.change": (
            "Change the last token's key and value; how far does each output move?",
            "修改最后一个 token 的键和值；每个输出变化多少？",
        ),
        "lesson.leak.line": (
            "q0 moves {a} under the causal mask and {b} under the inverted one: a leak",
            "在因果遮罩下 q0 变化 {a}，在写反的遮罩下变化 {b}：信息泄漏",
        ),
        "lesson.leak.note": (
            "A strictly causal output may not depend on future tokens (up to rounding); only the last query, which "
            "may see the changed token, moves.",
            "严格因果的输出不应依赖未来 token（除浮点误差外）；只有能看到被修改 token 的最后一个查询会变化。",
        ),
        "lesson.leak.caveat": (
            "A correct mask is necessary, not sufficient: labels in the input or future statistics in preprocessing "
            "leak too (001 §20).",
            "Mask 正确只是必要条件：标签被拼入输入、预处理使用未来统计量同样会造成泄漏（001 §20）。",
        ),
    }
)

_M.update(
    {
        # ---- mistakes.py
        "mistake.softmax-then-mask": (
            "softmax first, then zero the masked weights (no renormalisation)",
            "先 softmax，再把被屏蔽的权重置零（没有重新归一化）",
        ),
        "mistake.no-scale": ("forgetting to divide the scores by sqrt(d_k)", "忘记把分数除以 sqrt(d_k)"),
        "mistake.sqrt-d-model": (
            "dividing by sqrt(d_model) instead of sqrt(d_head) in multi-head attention",
            "多头 Attention 中除以 sqrt(d_model) 而不是 sqrt(d_head)",
        ),
        "mistake.query-axis": (
            "softmax over the query axis (columns) instead of the key axis (rows)",
            "沿查询维度（列）而不是键维度（行）做 softmax",
        ),
        "mistake.inverted-mask": (
            "a True = may-attend mask given to code where True means blocked",
            "把“True 表示允许”的遮罩交给“True 表示屏蔽”的代码",
        ),
        "mistake.stm.nothing": (
            "Nothing is masked here, so the order does not matter yet; add a mask (--causal, --padding) to see the "
            "row sums fall below 1.",
            "这里没有任何位置被屏蔽，所以顺序暂时无关；加上遮罩（--causal、--padding）就能看到行和小于 1。",
        ),
        "mistake.stm.text": (
            "softmax ran over every key, masked ones included, and the masked weights were zeroed afterwards: the row "
            "sums are {sums} instead of 1 (row {r}: {s}). The result is no longer a probability distribution and the "
            "masked keys still steered the legal weights. Mask first (-inf before softmax), so softmax renormalises "
            "over the legal keys only.",
            "softmax 在所有键（包括被屏蔽的键）上计算，之后才把被屏蔽的权重置零：行和是 {sums} 而不是 1（第 {r} 行："
            "{s}）。结果不再是概率分布，而且被屏蔽的键仍然影响了合法权重。应先遮罩（softmax 前置为 -inf），让 softmax "
            "只在可见候选集合中重新归一化。",
        ),
        "mistake.noscale.text": (
            "without the scale the logits are {f}× larger (sqrt(d_k) = sqrt({d})), so the weights are sharper: the "
            "largest weight per row goes from {a} to {b}. With large d_k softmax saturates toward one-hot and its "
            "gradients vanish.",
            "没有缩放时 logits 大了 {f} 倍（sqrt(d_k) = sqrt({d})），权重更尖锐：每行的最大权重从 {a} 变为 {b}。d_k "
            "较大时 softmax 趋于 one-hot，梯度变小。",
        ),
        "mistake.dmodel.text": (
            "with {h} heads of d_head = {d}, d_model = {dm}; dividing by sqrt({dm}) instead of sqrt({d}) makes every "
            "logit sqrt({h}) = {f}× too small, so the weights are flatter: the largest weight per row goes from {a} "
            "to {b}. Each head attends in its own d_head-dim space: scale by 1/sqrt(d_head).",
            "{h} 个头、每头 d_head = {d}，则 d_model = {dm}；除以 sqrt({dm}) 而不是 sqrt({d}) 会让每个 logit 小 "
            "sqrt({h}) = {f} 倍，权重更平：每行的最大权重从 {a} 变为 {b}。每个头在自己的 d_head 维空间中计算："
            "应按 1/sqrt(d_head) 缩放。",
        ),
        "mistake.axis.text": (
            "softmax ran down each column (over the queries), so each KEY's column sums to 1 and the query rows sum "
            "to {sums}. That measures how much each key is read by different queries, not where each query reads "
            "from. Check: weights.sum(axis=-1) must be 1 on every legal row.",
            "softmax 沿每一列（查询维度）计算，于是每个键所在的列和为 1，而查询行的和是 {sums}。这衡量的是某个键被不同"
            "查询关注的相对程度，而不是每个查询从哪里读取。检查：weights.sum(axis=-1) 在每个合法行上必须为 1。",
        ),
        "mistake.axis.symmetric": (
            "Here the logits are symmetric (S = Sᵀ, the same mask both ways), so the column softmax equals the row "
            "softmax and the mistake is invisible: try it on causal-4 or on a non-symmetric Q, K.",
            "这里的 logits 是对称的（S = Sᵀ，遮罩也对称），所以按列和按行的 softmax 结果相同，错误看不出来：请在 "
            "causal-4 或不对称的 Q、K 上试一试。",
        ),
        "mistake.inv.all": (
            "every key was allowed, so read as True = blocked the mask blocks everything: every row is 0/0 = NaN. "
            "Convert conventions at the edge (attnlab.masks.from_blocked / to_blocked), never by guessing.",
            "所有键都是允许的，按“True 表示屏蔽”来读，遮罩就屏蔽了一切：每一行都是 0/0 = NaN。应在边界处用转换函数"
            "（attnlab.masks.from_blocked / to_blocked）转换约定，而不是猜测。",
        ),
        "mistake.inv.text": (
            "the mask was read with the opposite meaning: each query now reads exactly the keys it must not see",
            "遮罩被按相反的含义读取：每个查询现在恰好读取它不该看到的键",
        ),
        "mistake.inv.leak": (
            " (the future, under a causal mask: a leak)",
            "（在因果遮罩下就是未来位置：信息泄漏）",
        ),
        "mistake.inv.nan": (
            ", and row(s) {rows} are left with no key at all: 0/0 = NaN",
            "，而第 {rows} 行一个键也不剩：0/0 = NaN",
        ),
        "mistake.inv.check": (
            ". Check which convention a library uses (PyTorch SDPA bool: True = attend; nn.MultiheadAttention: True "
            "= blocked) and convert with attnlab.masks.from_blocked.",
            "。要确认库使用的约定（PyTorch SDPA 的布尔遮罩：True 表示允许；nn.MultiheadAttention：True 表示屏蔽），"
            "并用 attnlab.masks.from_blocked 转换。",
        ),
    }
)

_M.update(
    {
        # ---- online.py
        "online.title": (
            "{title}: FlashAttention's online softmax, key blocks of {b}",
            "{title}：FlashAttention 的在线 softmax，每块 {b} 个键",
        ),
        "online.source": (
            "FlashAttention's tiling + online softmax (article 001)",
            "FlashAttention 的分块 + 在线 softmax（文章 001）",
        ),
        "online.blocks.title": ("The keys in {n} block(s) of {b}", "键分成 {n} 块，每块 {b} 个"),
        "online.blocks.note": (
            "These are the logits (scaled scores, masked entries -inf). The tiled kernel never holds this whole "
            "matrix: it computes one block of it, uses it and drops it. It is shown whole here only to check the "
            "blocks against it.",
            "这是 logits（缩放后的分数，被屏蔽的位置为 -inf）。分块内核从不保存整个矩阵：每次只计算一块、使用后丢弃。"
            "这里完整显示它，只是为了核对各块。",
        ),
        "online.block.title": ("Key block {b}: {a}..{z}", "第 {b} 块键：{a}..{z}"),
        "online.none_yet": (
            "{r}: no legal key yet: m = -inf, l = 0, acc = 0",
            "{r}：还没有合法的键：m = -inf，l = 0，acc = 0",
        ),
        "online.first": (
            "First block: nothing seen before it, so α = 0 and m, l, acc start from this block alone.",
            "第一块：之前什么也没有，所以 α = 0，m、l、acc 只由这一块开始。",
        ),
        "online.rescaled": (
            "α < 1 on {rows}: this block holds a larger score than any before it, so the sum and the accumulator so "
            "far are rescaled to the new maximum: exp(x - m_old) · exp(m_old - m_new) = exp(x - m_new). Nothing is "
            "recomputed.",
            "{rows} 上 α < 1：这一块含有比之前都大的分数，所以到目前为止的和与累加器按新的最大值重新缩放："
            "exp(x - m_old) · exp(m_old - m_new) = exp(x - m_new)。不需要重新计算。",
        ),
        "online.same": (
            "No row's maximum grew (α = 1): this block's terms are simply added.",
            "没有哪一行的最大值变大（α = 1）：这一块的项直接加上。",
        ),
        "online.blind": (
            "{rows} may see no key of this block: P = 0 there and nothing changes. The tiled kernel skips a block "
            "that no query of its query block may see, without computing it.",
            "{rows} 看不到这一块的任何键：那里 P = 0，什么也不变。若一个查询块中没有查询能看到某个键块，分块内核会"
            "直接跳过它，不做计算。",
        ),
        "online.empty": (
            "o[{r}]: no legal key in any block (masked_rows={p}: {o})",
            "o[{r}]：所有块中都没有合法的键（masked_rows={p}：{o}）",
        ),
        "online.normalize.title": ("Normalize once, at the end", "最后只归一化一次"),
        "online.normalize.note": (
            "The same output as softmax(S) V computed densely (largest difference {d} in float64; the log-sum-exp "
            "{l}): only the order of the additions differs, nothing is approximated. Memory per query: m, l and "
            "acc, whatever n_k is.",
            "与稠密计算 softmax(S) V 的输出相同（float64 中最大差 {d}；log-sum-exp 差 {l}）：只是加法的顺序不同，"
            "没有任何近似。每个查询的内存只有 m、l 和 acc，与 n_k 无关。",
        ),
    }
)

#: Chinese titles and sources of every named example and lesson (English ones come from attnlab.articles).
_ZH_TITLES: dict[str, tuple[str, str]] = {
    "weighted-average": ("Attention 是加权平均：0.6 v1 + 0.3 v2 + 0.1 v3", "001 §1"),
    "one-query": ("一个查询 [1, 0] 对两个键 [1, 0] 与 [0, 1]", "000，「把一行注意力完整算出来」"),
    "2x2": ("2×2 算例：Q = K = I，V = [[10, 0], [0, 20]]", "001 §5"),
    "2x2-causal": ("加上因果遮罩的 2×2 算例", "001 §7.3"),
    "causal-4": ("四个位置的因果遮罩：第 i 行有 i + 1 个合法键", "000，「因果性是一条信息边界」"),
    "saturation": ("为什么要缩放：softmax([1, 2]) 与 softmax([10, 20])", "001 §4.2"),
    "mask-order": ("先遮罩再 softmax：分数 [1, 2]，屏蔽第二个键", "001 §7.4"),
    "one-query-v100": ("把 v0 改成 [100, 0]：权重不变，输出改变", "000，Notebook"),
    "dot-product": ("点积是匹配分数，不是概率：同向、反向、正交", "001 §3、§3.1"),
    "cross": ("Cross-Attention：2 个查询读取 3 个源位置；A 是 [2, 3]，不是方阵", "001 §2.2、§8"),
    "padding": ("填充遮罩屏蔽 PAD 键所在的列；PAD 查询仍有输出", "001 §7.1、§17.4"),
    "all-masked": ("某个查询的所有键都被屏蔽：对空集合做 softmax 是 0/0 = NaN", "001 §7.5；000，工程陷阱"),
    "column-bias": ("自测后半部分：给不同列加不同偏置会改变权重", "000，自测"),
    "variance": ("为什么除以 sqrt(d_k)：q·k 的方差随 d_k 增长，缩放使其恢复", "001 §4.1"),
    "overflow": ("稳定 softmax：不先减去行最大值，e^1000 会溢出", "001 §6"),
    "fp16-mask": ("加性遮罩与数据类型：-1e9 在 float32 中可用，在 float16 中变成 -inf", "001 §7"),
    "self-test": ("自测：给每个合法分数加 100；再给不同列加不同偏置", "000，自测"),
    "multi-head": ("多头：拆分 -> 每头 Attention -> 拼接 -> W_O，写出每一步的形状", "001 §10-§11；000"),
    "dropout": ("权重上的 Dropout：inverted dropout 之后行和不再为 1", "001 §18"),
    "growth": ("T² 增长：1,024 -> 4,096 个 token，长度 4 倍，分数矩阵元素 16 倍", "000；001 §13、§19"),
    "complexity": ("复杂度：投影 O(B n d²)、分数 O(B n² d)、内存 O(B h n²)、KV Cache", "001 §13-§15"),
    "leak-test": ("泄漏测试：修改一个未来 token，因果输出不应变化", "001 §17.3、§20"),
    "mask-not-access": ("Mask 不是权限控制：b 从不关注秘密，却在第二层经由 a 读到它", "001 §17.5、§21"),
    "long-context": ("长上下文：n 翻倍时分数矩阵元素变为 4 倍；窗口、MQA/GQA 与 KV Cache 的增长不同", "001 §19"),
    "invariants": ("每个 Attention 实现都要保持的六个不变量，各附其数值", "001 §21"),
}


# ---- the command line's help (attnlab explain and attnlab heatmap; argparse's own words under "argparse.")
_M.update(
    {
        "help.metavar.example": ("EXAMPLE", "示例"),
        "help.metavar.file": ("FILE", "文件"),
        "help.metavar.name": ("NAME", "名称"),
        "help.metavar.labels": ("LABELS", "标签"),
        "help.metavar.mask": ("MASK", "遮罩"),
        "help.metavar.heads": ("HEADS", "头数"),
        "help.metavar.width": ("WIDTH", "宽度"),
        "help.metavar.seed": ("SEED", "种子"),
        "help.metavar.text": ("TEXT", "文本"),
        "help.metavar.title": ("TITLE", "标题"),
        "help.metavar.n": ("N", "N"),
        "help.example": (
            "a worked example of the articles: {names} (or give --q, --k, --v)",
            "文章中的一个算例：{names}（或给出 --q、--k、--v）",
        ),
        "help.list": ("list the named examples and exit", "列出所有命名示例后退出"),
        "help.group.own": ("your own matrices", "你自己的矩阵"),
        "help.group.own_desc": (
            "inline '1,0;0,1' or '[[1,0],[0,1]]', or a .json/.csv/.npy file; a matrix that starts with a minus sign "
            "needs '=': --q='-1,0;0,1'",
            "直接写 '1,0;0,1' 或 '[[1,0],[0,1]]'，或给一个 .json/.csv/.npy 文件；以负号开头的矩阵要用 '='：--q='-1,0;0,1'",
        ),
        "help.q": ("queries [n_q, d_k]", "查询 [n_q, d_k]"),
        "help.k": ("keys [n_k, d_k]", "键 [n_k, d_k]"),
        "help.v": ("values [n_k, d_v]", "值 [n_k, d_v]"),
        "help.inputs": (
            "one .json object {q, k, v, mask?, tokens?} or an .npz archive",
            "一个 .json 对象 {q, k, v, mask?, tokens?} 或一个 .npz 文件",
        ),
        "help.tokens": (
            "labels for the positions ('the cat sat' or 'the,cat,sat'); self-attention",
            "各位置的标签（'我 喜欢 猫' 或 '我,喜欢,猫'）；用于 Self-Attention",
        ),
        "help.query_tokens": ("labels for the queries (cross-attention)", "查询的标签（Cross-Attention）"),
        "help.key_tokens": ("labels for the keys (cross-attention)", "键的标签（Cross-Attention）"),
        "help.group.masks": ("masks and options", "遮罩与选项"),
        "help.mask": (
            "a boolean mask [n_q, n_k]: '1 0; 1 1' (■/⬚ and true/false work too)",
            "布尔遮罩 [n_q, n_k]：'1 0; 1 1'（也可以用 ■/⬚ 和 true/false）",
        ),
        "help.mask_convention": (
            "what 1/True means in --mask: allow (attnlab, PyTorch SDPA) or block (nn.MultiheadAttention)",
            "--mask 中 1/True 的含义：allow 允许关注（attnlab、PyTorch SDPA）或 block 屏蔽（nn.MultiheadAttention）",
        ),
        "help.causal": ("query i sees keys j <= i", "因果遮罩：查询 i 只看到键 j <= i"),
        "help.causal_align": (
            "causal with n_q != n_k: top_left (PyTorch is_causal) or bottom_right (decoding: the last query is the "
            "newest token and sees every key); implies --causal",
            "n_q ≠ n_k 时的因果遮罩：top_left（PyTorch 的 is_causal）或 bottom_right（解码：最后一个查询是最新的 token，"
            "看到所有键）；隐含 --causal",
        ),
        "help.no_causal": (
            "drop a named example's causal mask (see it without)",
            "去掉命名示例的因果遮罩（看看没有它时的结果）",
        ),
        "help.bias": (
            "additive scores: one number per key '0,1,2,3' (a different bias per column) or a matrix [n_q, n_k]",
            "加到分数上的偏置：每个键一个数 '0,1,2,3'（每列不同的偏置）或一个矩阵 [n_q, n_k]",
        ),
        "help.padding": (
            "only N key positions are real tokens (0 <= N <= n_k); the rest is padding",
            "只有 N 个键位置是真实 token（0 <= N <= n_k）；其余是填充",
        ),
        "help.padding_side": ("where the padding sits", "填充的位置：right 右侧或 left 左侧"),
        "help.temperature": (
            "divide the logits by T: finite, >= 2.2250738585072014e-308 so that 1/T is finite (default 1)",
            "温度：logits 除以 T；有限且 >= 2.2250738585072014e-308，使 1/T 有限（默认 1）",
        ),
        "help.shift": ("add C to every score after scaling", "缩放之后给每个分数加 C"),
        "help.scale": ("multiply Q Kᵀ by S instead of 1/sqrt(d_k)", "缩放：Q Kᵀ 乘以 S，而不是 1/sqrt(d_k)"),
        "help.masked_rows": (
            "a query row with no legal key: an error (default), zeros (as FlashAttention) or NaN (naive code)",
            "没有合法键的查询行：raise 报错（默认）、zero 置零（同 FlashAttention）或 nan（朴素实现的结果）",
        ),
        "help.group.output": ("output", "输出"),
        "help.mistake": (
            "show a classic mistake next to the right computation: {names}, or all (repeatable)",
            "在正确计算旁展示一个经典错误：{names}，或 all（可重复）",
        ),
        "help.heads": (
            "heads for --mistake sqrt-d-model: d_model = heads·d_k (8)",
            "--mistake sqrt-d-model 的头数：d_model = 头数·d_k（8）",
        ),
        "help.format": (
            "auto: rich tables in a terminal, plain text in a pipe",
            "输出格式；auto：终端中用 rich 表格，管道中用纯文本",
        ),
        "help.width": ("line width of the text format (>= 20, default 100)", "纯文本格式的行宽（>= 20，默认 100）"),
        "help.tiled": (
            "FlashAttention's online softmax instead: the keys in blocks of B, a running max, sum and accumulator",
            "改为 FlashAttention 的在线 softmax：键按每块 B 个分块，维护滚动最大值、和与累加器",
        ),
        "help.lang": (
            "language of every explanation, label and message: en (default) or zh (中文); {env}=zh sets the default "
            "and the language of --help",
            "所有解释、标签和信息的语言：en（默认）或 zh（中文）；环境变量 {env}=zh 设定默认语言和 --help 的语言",
        ),
        "help.backward": (
            "article 001 §9: the gradients by hand (dV, dA, dS, dQ, dK), checked against attention_backward",
            "文章 001 §9：手算梯度（dV、dA、dS、dQ、dK），并与 attention_backward 核对",
        ),
        "help.grad_out": (
            "--backward: the upstream gradient G_O = dL/dO [n_q, d_v] (default all ones: L = sum of O)",
            "--backward：上游梯度 G_O = dL/dO [n_q, d_v]（默认全为 1：L = O 的元素和）",
        ),
        "help.dropout": (
            "article 001 §18: inverted dropout on the weights with drop probability P; shows the row sums after it",
            "文章 001 §18：以丢弃概率 P 对权重做 inverted dropout；显示之后的行和",
        ),
        "help.seed": ("--dropout: seed of the dropout mask (default 0)", "--dropout：Dropout 掩码的随机种子（默认 0）"),
        "help.positions": (
            "article 001 §16: permuting the tokens permutes the outputs, unless positions (RoPE) are added",
            "文章 001 §16：打乱 token 顺序只会同样打乱输出，除非加入位置信息（RoPE）",
        ),
        "help.explain.description": (
            "attnlab explain: attention computed by hand, every step from Q Kᵀ to the output, with the classic mistakes.",
            "attnlab explain：手算 Attention，从 Q Kᵀ 到输出的每一步，以及经典错误。",
        ),
        "help.heatmap.description": (
            "attnlab heatmap: draw attention weights (rows = queries, columns = keys) to a PNG, SVG or PDF file.",
            "attnlab heatmap：把注意力权重（行 = 查询，列 = 键）画成 PNG、SVG 或 PDF 文件。",
        ),
        "help.heatmap.group.sources": ("other sources", "其他来源"),
        "help.heatmap.weights": (
            "draw saved weights: .npy [n_q, n_k] or [h, n_q, n_k], .json, .csv",
            "画保存下来的权重：.npy [n_q, n_k] 或 [h, n_q, n_k]、.json、.csv",
        ),
        "help.heatmap.model": ("draw a real model's attention on --text", "画真实模型在 --text 上的注意力"),
        "help.heatmap.text": (
            "--model: the prompt (SmolLM2) or sentence (MiniLM); its tokens label the axes",
            "--model：提示（SmolLM2）或句子（MiniLM）；它的 token 标注坐标轴",
        ),
        "help.heatmap.layer": ("--model: layer, from 0 (default 0)", "--model：层号，从 0 开始（默认 0）"),
        "help.heatmap.head": (
            "--model: one head, from 0 (default: every head)",
            "--model：一个头，从 0 开始（默认：所有头）",
        ),
        "help.heatmap.group.picture": ("picture", "图"),
        "help.heatmap.output": (
            "file to write: .png, .svg or .pdf (attention.png)",
            "输出文件：.png、.svg 或 .pdf（attention.png）",
        ),
        "help.heatmap.kind": (
            "weights (heatmap; one panel per head for [h, n_q, n_k]), last-row (bar chart of the last query), mask, "
            "growth (the T² plot)",
            "weights 权重热力图（[h, n_q, n_k] 时每个头一幅）、last-row 最后一个查询的条形图、mask 遮罩、growth T² 增长图",
        ),
        "help.heatmap.title": ("figure title", "图的标题"),
        "help.heatmap.values": ("write weights in cells", "在格子里写出权重"),
        "help.heatmap.dpi": (
            "resolution of PNGs ({lo} to {hi}; default 150)",
            "PNG 的分辨率（{lo} 到 {hi}；默认 150）",
        ),
        "perm.tokens": (
            "Tokens x [{n}, {d}] are permuted by {perm} (self-attention, no mask, float64).",
            "token x [{n}, {d}] 按 {perm} 重新排列（Self-Attention，无遮罩，float64）。",
        ),
        "perm.without": (
            "Without positions: max |attn(P x) - P attn(x)| = {x}  -> the outputs only move with their tokens: "
            "attention alone cannot see word order (article 001, §16).",
            "没有位置信息：max |attn(P x) - P attn(x)| = {x}  -> 输出只是跟着各自的 token 移动：单靠 Attention 看不到"
            "词序（文章 001 §16）。",
        ),
        "perm.with": (
            "With RoPE:         max |attn(P x) - P attn(x)| = {x}  -> rotating q and k by their positions makes each "
            "score depend on the distance i - j, so the order now matters.",
            "加上 RoPE：        max |attn(P x) - P attn(x)| = {x}  -> 按位置旋转 q 和 k，使每个分数取决于距离 i - j，"
            "于是顺序变得重要。",
        ),
        "argparse.usage": ("usage: ", "用法："),
        "argparse.positionals": ("positional arguments", "位置参数"),
        "argparse.options": ("options", "选项"),
        "argparse.help": ("show this help message and exit", "显示此帮助信息并退出"),
    }
)


def _titles() -> dict[str, tuple[str, str]]:
    from ..articles import EXAMPLES, EXTRA_EXAMPLES, LESSONS

    out = {}
    for table in (EXAMPLES, EXTRA_EXAMPLES, LESSONS):
        for name, ex in table.items():
            zh_title, zh_source = _ZH_TITLES[name]
            out[f"title.{name}"] = (ex.title, zh_title)
            out[f"source.{name}"] = (ex.source, zh_source)
    return out


_M.update(_titles())

#: Keys are grouped by where they are shown (``cli.``, ``help.``, ``render.``, ``step.``, ``mistake.``, ``online.``,
#: ``lesson.``, ``title.``, ``source.`` ...); the one merged table is :data:`attnlab.i18n.MESSAGES`.
register("explain", _M)
