# ruff: noqa: E501  (the catalogue keeps each message on one line; Chinese characters count double)
"""The lab's words in English (the default) and Chinese, with the articles' own terms (查询、键、值、因果遮罩、温度).

The lab's table of the one catalogue (:mod:`attnlab.i18n`). Strings are written in English where they are used, and
that English text is their key: :func:`t` (:func:`attnlab.i18n.text`) returns the Chinese for ``lang="zh"``
(``{name}`` fields filled in either way). A string missing from :data:`ZH` shows in English, which the browser test
for the Chinese view catches. Explanations computed by ``attnlab explain`` (the steps, the examples' titles) and
messages about bad input come from the same catalogue under their own keys.

>>> t("en", "reveal"), t("zh", "reveal")
('reveal', '揭晓')
>>> t("zh", "Score: {right} of {total} committed predictions right", right=2, total=3)
'得分：已锁定的 3 个预测中答对 2 个'
"""

from __future__ import annotations

from ..i18n import register
from ..i18n import text as t

__all__ = ["BIGGER", "INTRO", "LANGS", "LIVE_INTRO", "PREDICT_INTRO", "SELF_TEST_ANSWER", "ZH", "t"]

#: The languages of the switch: code -> name shown.
LANGS = {"en": "English", "zh": "中文"}

#: The lab's opening text (Markdown): what the page computes and how to use it.
INTRO = r"""
# Compute attention by hand: Q, K, V and the causal mask

Every query scores every key (**S = Q Kᵀ / √d_k**), each row of scores becomes weights with a softmax over the
keys it may see, and the output is the **weighted sum of the values**, O = A V. Pick an item of the articles below
(or edit the matrices), switch masks on and off, move the sliders, and watch every step.

*How to read the tables and the heatmap: rows are queries (the readers), columns are keys (read from). Check the
axes, the mask and the row sums first. A large weight says where a query reads from; it does not say that key
caused the answer (that needs replacement, deletion or intervention experiments: see the live model below).*
"""

#: The text above the predict-then-reveal questions (Markdown).
PREDICT_INTRO = r"""
## Predict, commit, then reveal

For each experiment pick what you expect **before** you reveal the result: the prediction you had picked is
**locked** the moment you reveal, and the score counts it. Changing your answer afterwards is shown as a change,
never as a right prediction. The experiments use your inputs above (they open on the articles' four positions with
the causal mask).
"""

#: The answer revealed by the self-test on shifting a row of scores.
SELF_TEST_ANSWER = (
    "Mathematically softmax is unchanged by the same shift on a whole row; implementations subtract the row maximum "
    "first so exp never overflows. Adding different amounts to different columns would change the weights: that is "
    "part 2."
)

#: The "Bigger pictures" text: multi-head widths and the T² growth of the scores (Markdown).
BIGGER = r"""
## Bigger pictures

**Multi-head.** With d_model = 512 and 8 heads, each head works in d_head = 64 dimensions and scales by 1/√64,
not 1/√512; each head has its own projections and its own weights matrix, and the outputs are concatenated and
projected back (the live model below shows every head of every layer).

**T² growth.** The score matrix has T × T entries: from 1,024 to 4,096 tokens the length grows 4× and the matrix
16×. (End-to-end latency depends on batch, memory traffic and kernels; FlashAttention computes the same exact
attention tile by tile without storing the matrix.)
"""

#: The text above the live model's attention weights (Markdown).
LIVE_INTRO = r"""
## A live model: real attention weights

Type a sentence and press **run**: SmolLM2-135M (a causal language model, 30 layers × 9 heads) runs it on attnlab's
own NumPy Llama, from the installed GGUF file, offline; all-MiniLM-L6-v2 is a bidirectional encoder (every token
reads every real token), run with two [PAD] positions so you can see the padding mask. Pick a layer and a head; the
model view shows every head of every layer at once. The model starts loading in the background as soon as the page
opens, once per server (a few seconds; the page stays usable meanwhile), then each sentence takes about a second and
is remembered.

*Then test what the weights mean: delete each token and measure how much the prediction changes. A token can get
much weight and matter little, and the other way round.*
"""

#: The lab's Chinese strings, keyed by their English text (registered in :mod:`attnlab.i18n`).
ZH: dict[str, str] = {
    "reveal": "揭晓",
    "Score: {right} of {total} committed predictions right": "得分：已锁定的 {total} 个预测中答对 {right} 个",
}


ZH.update(
    {
        # ---- page text
        INTRO: r"""
# 亲手算一遍 Attention：Q、K、V 与因果遮罩

每个查询都给每个键打分（**S = Q Kᵀ / √d_k**），每一行分数在它可见的键上做 softmax 变成权重，输出是**值的加权和**
O = A V。在下面选一个文章条目（或直接修改矩阵），开关遮罩，拖动滑块，观察每一步。

*怎样读表格和热力图：每一行是一个查询（读取者），每一列是一个键（被读取的位置）。先核对轴方向、遮罩和行和。强权重说明查询从哪里读取，
不说明那个键导致了答案（那需要替换、删除或干预实验：见下方的真实模型）。*
""",
        PREDICT_INTRO: r"""
## 先预测，锁定，再揭晓

每个实验都请在揭晓之前**先选出**你的预期：揭晓的那一刻，你选中的预测就被**锁定**并计入得分。揭晓之后再改答案，会显示为“改过答案”，
绝不会算作预测正确。实验使用上方的输入（打开时是文章中带因果遮罩的四个位置）。
""",
        SELF_TEST_ANSWER: "数学上不会。softmax 对同一行的统一平移不变；实现通常先减去行最大值，以免 exp 溢出。"
        "给不同列加不同偏置则会改变权重：这就是第二部分。",
        BIGGER: r"""
## 更大的图景

**多头。** d_model = 512、8 个头时，每个头在 d_head = 64 维中计算，缩放用 1/√64 而不是 1/√512；每个头有自己的投影和自己的权重矩阵，
各头输出沿特征维拼接，再经输出投影回到模型宽度（下方的真实模型展示每一层的每一个头）。

**T² 增长。** 分数矩阵有 T × T 个元素：序列从 1,024 增加到 4,096，长度增加 4 倍，矩阵元素增加 16 倍。（端到端延迟还受 batch、
内存访问和内核实现影响；FlashAttention 分块计算同样精确的注意力，而不存下整个矩阵。）
""",
        LIVE_INTRO: r"""
## 真实模型：真实的注意力权重

输入一句话并按 **运行**：SmolLM2-135M（因果语言模型，30 层 × 9 个头）用 attnlab 自己的 NumPy Llama 离线运行已安装的 GGUF 文件；
all-MiniLM-L6-v2 是双向编码器（每个 token 读取所有真实 token），运行时附加两个 [PAD] 位置，让你看到填充遮罩。选择层和头；
模型总览同时显示每一层的每一个头。页面一打开，模型就在后台开始加载，每个服务器只加载一次（几秒钟，其间页面照常可用），
之后每句话约一秒，并会被记住。

*然后检验权重的含义：逐个删除 token，测量预测变化多少。一个 token 可能得到很大权重却影响很小，反之亦然。*
""",
        # ---- logic
        "v{row} := {new}. Largest weight change: {dw}; largest output change: {do}.": "v{row} := {new}。权重的最大变化：{dw}；输出的最大变化：{do}。",
        "First row with the causal mask: {causal}: one legal key gets everything, at any temperature. Without the mask it reads {full}, future keys included.": "因果遮罩下的第一行：{causal}：唯一的合法键得到全部权重，与温度无关。去掉遮罩后它读取 {full}，包括未来的键。",
        "Fix the inputs above first.": "请先修正上方的输入。",
        "This experiment needs V with {n} columns and a row {row}.": "这个实验需要 V 有 {n} 列，并且有第 {row} 行。",
        # ---- messages about the learner's input (lab.logic raises them with attnlab.i18n.localized)
        "{name}: {r}×{c} is larger than the lab allows ({n} rows × {d} columns); use `attnlab explain` or the library for bigger inputs": "{name}：{r}×{c} 超出了实验室的上限（{n} 行 × {d} 列）；更大的输入请用 attnlab explain 或库函数",
        "K: rows have {dk} number(s) but Q's have {dq}; q·k needs equal lengths": "K：每行有 {dk} 个数字，而 Q 的每行有 {dq} 个；q·k 需要相同长度",
        "V: {nv} row(s) but K has {nk}; every key needs one value row": "V：有 {nv} 行，而 K 有 {nk} 行；每个键需要一行值",
        "value row: {row} is not a key position (0 … {last})": "值的行号：{row} 不是键的位置（0 … {last}）",
        "v{row}: expected one row of {d} number(s), got {r}×{c}": "v{row}：需要一行 {d} 个数字，实际是 {r}×{c}",
        "mask: {r}×{c}, expected {n_q}×{n_k} (one row per query, one column per key) or 1×{n_k}": "遮罩：{r}×{c}，需要 {n_q}×{n_k}（每个查询一行，每个键一列）或 1×{n_k}",
        "causal: {n_q} queries but only {n_k} keys; a causal query must be one of the key positions (fewer queries than keys is decoding: the last query sees every key)": "因果遮罩：{n_q} 个查询但只有 {n_k} 个键；因果查询必须是键的位置之一（查询比键少是解码：最后一个查询看到所有键）",
        "padding: {p} padded key(s) but there are only {n_k} keys": "填充：{p} 个填充的键，但只有 {n_k} 个键",
        "tokens: {n} token(s) for {n_k} positions (tokens label self-attention)": "token 标签：{n} 个 token 对应 {n_k} 个位置（标签用于自注意力）",
        "scale: expected one positive number (empty: 1/sqrt(d_k)), got {got!r}": "缩放：需要一个正数（空着：1/sqrt(d_k)），实际是 {got!r}",
        "bias: {r}×{c}, expected one number per key (1×{n_k}) or one row per query ({n_q}×{n_k})": "偏置：{r}×{c}，需要每个键一个数（1×{n_k}）或每个查询一行（{n_q}×{n_k}）",
        "MaskedRowError: query row {r} may attend to no key at all.": "MaskedRowError：查询行 {r} 没有任何可关注的键。",
        "Query row(s) {rows} may attend to no key at all (every key is masked), so softmax would divide 0 by 0. This is the fully-masked-row trap: padding AND causal often empties a row. Switch 'fully masked rows' to 'zero' (FlashAttention's choice) or 'nan' (what naive code gives) to see it.": "查询行 {rows} 没有任何可关注的键（所有键都被遮住），softmax 会变成 0 除以 0。这就是全遮罩行陷阱：填充遮罩与因果遮罩合并时常会让一行全空。把“全遮罩行”切换为 zero（FlashAttention 的做法）或 nan（朴素代码的结果）来观察。",
        "This experiment needs one bias per key ({n}).": "这个实验需要每个键一个偏置（共 {n} 个）。",
        "last query {q}: its real weights": "最后一个查询 {q}：它的真实权重",
        "softmax(x + c) = softmax(x): the shift cancels between numerator and denominator. Adding different amounts to different columns would change the weights.": "softmax(x + c) = softmax(x)：平移在分子和分母之间抵消。给不同列加不同的量则会改变权重。",
        "A bias that differs between the columns of a row does not cancel in softmax: keys with a larger bias gain weight. (A row with one legal key keeps [1, 0, …].)": "同一行中各列不同的偏置在 softmax 中不会抵消：偏置更大的键得到更多权重。（只有一个合法键的行仍是 [1, 0, …]。）",
        "The weights spread over the legal keys; masked keys stay exactly 0, and a row with one legal key stays [1, 0, …] at every temperature.": "权重在合法键之间趋于均匀；被遮罩的键始终正好为 0，只有一个合法键的行在任何温度下都是 [1, 0, …]。",
        "The weights depend only on Q and K (where to read); V is what is read.": "权重只取决于 Q 和 K（从哪里读取）；V 是读到的内容。",
        "output O = A V": "输出 O = A V",
        "weights A: rows = queries, columns = keys": "权重 A：行 = 查询，列 = 键",
        "no mask": "无遮罩",
        "policy 'zero' (FlashAttention): weights and output 0": "策略 zero（FlashAttention）：权重和输出都为 0",
        "policy 'raise' (attnlab's default):": "策略 raise（attnlab 的默认）：",
        "read as True = blocked (nn.MultiheadAttention)": "按 True = 屏蔽 读取（nn.MultiheadAttention）",
        "masked (never attended), unlike a small weight": "已遮罩（从不被关注），不同于很小的权重",
        "NaN: no legal key, policy 'nan'": "NaN：没有合法键，策略 nan",
        "Largest change of any weight:": "权重的最大变化：",
        "naive: NaN (and NaN spreads to every later layer)": "朴素实现：NaN（并且 NaN 会传播到之后的每一层）",
        "read as True = may attend (attnlab, PyTorch SDPA)": "按 True = 允许关注 读取（attnlab、PyTorch SDPA）",
        " (0 up to float64 rounding)": "（在 float64 舍入误差内为 0）",
        "output after": "修改后的输出",
        "Left padding (key PAD) combined with the causal mask: query PAD may only see key PAD, which is padding. Its row has no legal key: softmax over nothing is 0/0.": "左侧填充（键 PAD）与因果遮罩合并：查询 PAD 只能看到键 PAD，而它是填充。这一行没有合法键：对空集做 softmax 就是 0/0。",
        "One boolean mask:": "同一个布尔遮罩：",
        "row sums:": "行和：",
        "Entropy per row (higher = flatter):": "每行的熵（越高越平坦）：",
        "output before": "修改前的输出",
        "weights with a different bias per column": "每列不同偏置后的权重",
        "weights without a bias": "不加偏置的权重",
        "weights A = softmax(masked scores)": "权重 A = softmax(遮罩后的分数)",
        "weights before": "之前的权重",
        "weights after adding {c} to every legal score": "给每个合法分数加 {c} 之后的权重",
        "bias per key (column): {b}": "每个键（列）的偏置：{b}",
        # ---- presets
        "{source} {section}: {what}": "{source} {section}：{what}",
        "The article prints these numbers; attnlab computes them (marked):": "文章给出这些数字；attnlab 把它们算出来（已标记）：",
        # ---- live model
        "{model}: {n} tokens, forward pass {s} s; layer {layer}, head {head}.": "{model}：{n} 个 token，前向计算 {s} 秒；第 {layer} 层，第 {head} 个头。",
        "Rank correlation of weight and effect: {rho}. The token with the most weight ({a}) is {same} the one whose deletion changes the result most ({b}): a large weight says where the query reads, not what matters.": "权重与影响的秩相关：{rho}。得到最多权重的 token（{a}）{same}删除后结果变化最大的那个（{b}）：强权重说明查询从哪里读取，不说明什么重要。",
        "{name}: not loaded yet; it starts loading when the page opens, once per server.": "{name}：尚未加载；页面一打开就开始加载，每个服务器只加载一次。",
        "{name}: loading… {s} s (reading and dequantizing the weights, once per server)": "{name}：加载中… {s} 秒（读取并反量化权重，每个服务器只做一次）",
        "(cut to the first {n} tokens)": "（截取前 {n} 个 token）",
        "Bidirectional: every token reads every real token; the [PAD] keys are masked.": "双向：每个 token 读取所有真实 token；[PAD] 键被遮罩。",
        "layer {layer}, head {head}: rows = queries, columns = keys": "第 {layer} 层，第 {head} 个头：行 = 查询，列 = 键",
        "last token {q}: its real weights": "最后一个 token {q}：它的真实权重",
        "{name}: loaded in {s} s.": "{name}：已加载，用时 {s} 秒。",
        "{name} could not be loaded: {err}": "{name} 无法加载：{err}",
        "token deleted": "删除的 token",
        "effect ({name})": "影响（{name}）",
        "also": "也是",
        "not": "不是",
        "Measured on: {what}": "测量对象：{what}",
        "log p({y}) of the next token after position {i} ({tok})": "位置 {i}（{tok}）之后下一个 token 为 {y} 的 log p",
        "the sentence embedding (1 - cosine similarity)": "句向量（1 - 余弦相似度）",
        "layer {i}": "第 {i} 层",
        # ---- notebook
        "(your own inputs: the articles' four positions)": "（你自己的输入：文章中的四个位置）",
        "Article item (preset)": "文章条目（预设）",
        "Q (queries)": "Q（查询）",
        "K (keys)": "K（键）",
        "V (values)": "V（值）",
        "token labels": "token 标签",
        "rows of Q": "Q 的各行",
        "rows of K": "K 的各行",
        "rows of V": "V 的各行",
        "a sentence": "一句话",
        "I like green cats": "我 喜欢 绿色 猫",
        "causal mask": "因果遮罩",
        "padded keys": "填充的键",
        "padding side": "填充位置",
        "fully masked rows": "全遮罩行",
        "temperature T": "温度 T",
        "add to every score": "给每个分数加",
        "value row": "值的行号",
        "new value vector": "新的值向量",
        "bias per key": "每个键的偏置",
        "mask (1 = may attend)": "遮罩（1 = 允许关注）",
        "scale": "缩放",
        "*(no picture until the inputs are fixed)*": "*（输入修正之前没有图）*",
        "Every step, by hand (scores, scale, mask, max, exp, sums, weights, output)": "每一步手算（分数、缩放、遮罩、最大值、exp、求和、权重、输出）",
        "*(hidden until you reveal)*": "*（揭晓之前隐藏）*",
        "temperature": "温度",
        "SmolLM2-135M (causal language model)": "SmolLM2-135M（因果语言模型）",
        "model": "模型",
        "run": "运行",
        "layer": "层",
        "run the intervention (delete each token)": "运行干预实验（逐个删除 token）",
        "One row per line, numbers separated by commas. At most {n} positions and {d} numbers per row.": "每行一个向量，数字用逗号分隔。最多 {n} 个位置，每行最多 {d} 个数字。",
        "*Empty boxes keep the default: no bias, no extra mask, scale 1/√d_k. With fewer queries than keys the causal mask is a decoding query's: the last query sees every key.*": "*空着的框保持默认：没有偏置，没有额外遮罩，缩放 1/√d_k。查询比键少时，因果遮罩按解码查询对齐：最后一个查询看到所有键。*",
        "T² score elements against the length T": "分数矩阵元素数 T² 与长度 T",
        "{a:,} -> {b:,} tokens: {x:g}x the length, {y:g}x the elements": "{a:,} -> {b:,} 个 token：长度 {x:g} 倍，元素 {y:g} 倍",
        "all-MiniLM-L6-v2 (bidirectional encoder, with padding)": "all-MiniLM-L6-v2（双向编码器，带填充）",
        "Weights and output": "权重与输出",
        "1. A row with every key masked": "1. 所有键都被遮住的一行",
        "2. True means *allow* here, *block* there": "2. 这里 True 表示*允许*，那里表示*屏蔽*",
        "sentence": "句子",
        "*Deleting each token and running the model again…*": "*正在逐个删除 token 并重新运行模型…*",
        "*Press the button to compare the weight each token receives with the effect of deleting it.*": "*按下按钮，比较每个 token 得到的权重与删除它的影响。*",
        "Type a sentence and press run.": "输入一句话，然后按“运行”。",
        "Two traps": "两个陷阱",
        # ---- predictions
        "Score: no prediction committed yet (predict, then reveal)": "得分：还没有锁定的预测（先预测，再揭晓）",
        "You changed your answer to “{now}” after the reveal; the score keeps “{p}”.": "你在揭晓后把答案改成了“{now}”；得分仍按“{p}”计算。",
        "Make a prediction first": "请先做出预测",
        "(pick one above), then reveal: the result stays hidden until then.": "（在上方选一个），再揭晓：在那之前结果保持隐藏。",
        "Your prediction was right:": "你的预测正确：",
        "you committed “{p}”.": "你锁定的是“{p}”。",
        "Not quite.": "不太对。",
        "You committed “{p}”; the answer is “{c}”.": "你锁定的是“{p}”；答案是“{c}”。",
        "**1. Add 10 to every legal score.** What happens to the weights?": "**1. 给所有合法分数加 10。** 权重会怎样？",
        "the weights stay the same": "权重不变",
        "the weights get sharper": "权重变得更尖锐",
        "the weights get flatter": "权重变得更平坦",
        "**2. Raise the temperature to 3.** What happens?": "**2. 把温度提高到 3。** 会怎样？",
        "each row gets flatter over its legal keys": "每一行在合法键上变得更平坦",
        "each row gets sharper": "每一行变得更尖锐",
        "masked keys start to get weight": "被遮罩的键开始得到权重",
        "**3. Change v₀ to [100, 0]** (first value vector; V needs 2 columns). What changes?": "**3. 把 v₀ 改成 [100, 0]**（第一个值向量；V 需要 2 列）。什么会变？",
        "weights change, output changes": "权重变，输出变",
        "weights stay, output changes": "权重不变，输出变",
        "nothing changes": "什么都不变",
        "**4. Four 2-D Q/K pairs, causal mask on.** What is the first row of the weights?": "**4. 四组二维 Q/K，打开因果遮罩。** 权重的第一行是什么？",
        "it depends on the temperature": "取决于温度",
        "**Self-test, part 1: add 100 to every legal score of every row.** Does the output change?": "**自测第一部分：给每一行的所有合法分数都加 100。** 输出会改变吗？",
        "no, the output stays the same": "不会，输出不变",
        "yes, the output changes": "会，输出改变",
        "it overflows": "会溢出",
        "**Self-test, part 2: add a different bias to each key's column** (the bias box above, or 0, 1, 2, … here). Do the weights change?": "**自测第二部分：给每个键的列加不同的偏置**（上方的偏置框，或这里的 0, 1, 2, …）。权重会改变吗？",
        "yes, keys with a larger bias gain weight": "会，偏置更大的键得到更多权重",
        "no, softmax ignores any added constant": "不会，softmax 忽略任何加上的常数",
        "only the masked keys change": "只有被遮罩的键会变",
        # ---- article items: sections
        "one row by hand": "手算一行",
        "notebook": "Notebook",
        "one decoding query, causal": "一个解码查询，因果",
        "causality": "因果性",
        "trap: all-masked row": "陷阱：全遮罩行",
        "trap: True = allow vs True = block": "陷阱：True = 允许 与 True = 屏蔽",
        "multi-head": "多头",
        "T² growth": "T² 增长",
        "experiment: +10 on every legal score": "实验：所有合法分数加 10",
        "experiment: raise the temperature": "实验：提高温度",
        "experiment: mask off": "实验：关闭遮罩",
        "why sqrt(d_k)": "为什么除以根号 d_k",
        "self-test": "自测",
        "self-test, second half": "自测，第二部分",
        # ---- article items: what they show
        "q = [1, 0]: scores [0.707, 0], exp [2.028, 1], weights [0.670, 0.330], output [6.70, 6.60]": "q = [1, 0]：分数 [0.707, 0]，exp [2.028, 1]，权重 [0.670, 0.330]，输出 [6.70, 6.60]",
        "v0 = [100, 0]: the weights stay, the output changes": "v0 = [100, 0]：权重不变，输出改变",
        "a query that sees every earlier key (n_q = 1 < n_k = 2, bottom-right)": "看到所有之前键的查询（n_q = 1 < n_k = 2，右下对齐）",
        "four positions: row i has i + 1 legal keys": "四个位置：第 i 行有 i + 1 个合法键",
        "a row with no legal key: 0/0 = NaN": "没有合法键的一行：0/0 = NaN",
        "the same mask read the other way: the future leaks": "同一个遮罩按相反约定读取：未来信息泄漏",
        "d_model 512, 8 heads of 64: split, attend, concat, W_O": "d_model 512，8 个 64 维的头：拆分、注意力、拼接、W_O",
        "1,024 -> 4,096 tokens: 16x the elements": "1,024 -> 4,096 个 token：元素 16 倍",
        "predict, then run: the weights stay": "先预测再运行：权重不变",
        "rows flatten over the legal keys; the first row stays [1, 0, 0, 0]": "各行在合法键上趋于平坦；第一行保持 [1, 0, 0, 0]",
        "the same four Q/K pairs without the causal mask": "同样四组 Q/K，不加因果遮罩",
        "the variance of q·k grows with d_k": "q·k 的方差随 d_k 增长",
        "exact attention in key blocks with a running max and sum": "按键分块的精确注意力，维护滚动最大值与和",
        "+100 on every legal score: no change; a bias per column: a change": "所有合法分数加 100：不变；每列不同偏置：改变",
        "a different bias per column, on your own command line": "每列不同的偏置，用你自己的命令行",
        "o = 0.6 v1 + 0.3 v2 + 0.1 v3 = [6.5, 3.5]": "o = 0.6 v1 + 0.3 v2 + 0.1 v3 = [6.5, 3.5]",
        "self vs cross attention: A is [n_q, n_k] = [2, 3]": "自注意力与交叉注意力：A 的形状是 [n_q, n_k] = [2, 3]",
        "a dot product is not a probability: scores [2, -2, 0], row sum 0": "点积不是概率：分数 [2, -2, 0]，行和为 0",
        "Var(q·k) ≈ d_k, Var(q·k / sqrt(d_k)) ≈ 1": "Var(q·k) ≈ d_k，Var(q·k / sqrt(d_k)) ≈ 1",
        "softmax([1, 2]) = [0.269, 0.731]; softmax([10, 20]) = [0.000045, 0.999955]": "softmax([1, 2]) = [0.269, 0.731]；softmax([10, 20]) = [0.000045, 0.999955]",
        "the 2×2 example: A = [[0.6698, 0.3302], [0.3302, 0.6698]], O = [[6.698, 6.604], [3.302, 13.396]]": "2×2 算例：A = [[0.6698, 0.3302], [0.3302, 0.6698]]，O = [[6.698, 6.604], [3.302, 13.396]]",
        "e^1000 overflows without the max": "不减最大值时 e^1000 溢出",
        "-1e9 in float32 and float16": "-1e9 在 float32 与 float16 中",
        "padding masks keys; the PAD query still has an output": "填充遮罩作用于键；PAD 查询仍有输出",
        "the causal allow matrix C for length 4": "长度 4 的因果允许矩阵 C",
        "the 2×2 example with the causal mask: A = [[1, 0], [0.3302, 0.6698]], O = [[10, 0], [3.302, 13.396]]": "带因果遮罩的 2×2 算例：A = [[1, 0], [0.3302, 0.6698]]，O = [[10, 0], [3.302, 13.396]]",
        "softmax then mask: row sum 0.269": "先 softmax 再遮罩：行和 0.269",
        "a fully masked row is 0/0 = NaN": "全遮罩行是 0/0 = NaN",
        "the backward: dV = Aᵀ G_O, dA = G_O Vᵀ, dS, dQ, dK": "反向传播：dV = Aᵀ G_O，dA = G_O Vᵀ，dS，dQ，dK",
        "multi-head split -> concat -> W_O with the shapes": "多头：拆分 -> 拼接 -> W_O，附形状",
        "sqrt(d_model) instead of sqrt(d_head)": "用 sqrt(d_model) 代替 sqrt(d_head)",
        "projections vs scores, heads at a fixed d_model": "投影与分数的开销；d_model 固定时的头数",
        "FlashAttention's online softmax by hand": "手算 FlashAttention 的在线 softmax",
        "the KV cache size formula": "KV cache 大小公式",
        "permutation equivariance; RoPE breaks it": "排列等变性；RoPE 打破它",
        "no 1/sqrt(d_k)": "没有 1/sqrt(d_k)",
        "softmax over the wrong axis (visible on causal-4)": "在错误的维度上做 softmax（在 causal-4 上可见）",
        "... and invisible on the symmetric 2×2": "……在对称的 2×2 上不可见",
        "the leak test: change a future token": "泄漏测试：修改一个未来 token",
        "dropout: the row sums after inverted dropout": "dropout：倒置 dropout（除以 1 - p）之后的行和",
        "a mask is not access control: the secret reaches b through a": "Mask 不是权限控制：秘密经由 a 到达 b",
        "long context: doubling n, window, MQA/GQA, KV cache": "长上下文：n 翻倍、窗口、MQA/GQA、KV Cache",
        "the six invariants, each with its number": "六个不变量，各附其数值",
    }
)


# ---- issue 22 §2: the Chinese view as complete as the English (the marks' claims, the page's last English words)
ZH.update(
    {
        "The article prints these numbers; attnlab computes {k} of its {n} (marked):": "文章给出这些数字；attnlab 算出了其中 {k} 个（共 {n} 个，已标记）：",
        "The article prints these numbers; none of them is in this output (nothing marked):": "文章给出这些数字；本输出中一个也没有找到（未标记）：",
        "000 writes the output rounded to 2 decimals: [6.70, 6.60] is [6.6976, 6.6048].": "文章 000 把输出四舍五入到 2 位小数：[6.70, 6.60] 就是 [6.6976, 6.6048]。",
        "001 §5 prints O ≈ [[6.698, 6.604], [3.302, 13.396]]: V multiplied by the weights rounded to 0.6698 and 0.3302. The exact output is [[6.6976, 6.6048], [3.3024, 13.3952]]; §12's expected printout writes 6.6041 and 13.3959 for 6.6048 and 13.3952.": "文章 001 §5 写 O ≈ [[6.698, 6.604], [3.302, 13.396]]：那是用四舍五入后的权重 0.6698 和 0.3302 乘以 V 得到的。精确输出是 [[6.6976, 6.6048], [3.3024, 13.3952]]；§12 的预期输出把 6.6048 和 13.3952 写成了 6.6041 和 13.3959。",
        "001 §7.3 prints O = [[10, 0], [3.302, 13.396]] (the weights rounded to 0.3302 and 0.6698) and §12's expected printout 13.3959: the exact output is [[10, 0], [3.3024, 13.3952]].": "文章 001 §7.3 写 O = [[10, 0], [3.302, 13.396]]（用四舍五入后的权重 0.3302 和 0.6698），§12 的预期输出写 13.3959：精确输出是 [[10, 0], [3.3024, 13.3952]]。",
    }
)


# the live model's views and its Chinese text (attnlab.lab.views, attnlab.models.tokens; brief H-views)
ZH.update(
    {
        "Byte-level tokens merged into the {g} characters they form ({n} tokens): a query's weight on a character is the sum of its weights on that character's tokens (each row still sums to 1), and a character's row is the row of its last token, the position that has read the whole character.": "字节级 token 已合并成它们组成的 {g} 个字符（原为 {n} 个 token）：查询对一个字符的权重是它对该字符各 token 的权重之和（每行之和仍为 1）；一个字符的行取其最后一个 token 的行，即已读完整个字符的位置。",
        "MiniLM's vocabulary cannot represent {c} of the {n} characters of this text ({chars}): they became {k} [UNK] tokens, and the model sees an unknown token, not the characters.": "MiniLM 的词表无法表示这段文字 {n} 个字符中的 {c} 个（{chars}）：它们变成了 {k} 个 [UNK] token，模型看到的是未知 token，而不是这些字符。",
        "weight from {q}, layer {layer} head {head} (the head shown above)": "{q} 给它的权重：第 {layer} 层第 {head} 个头（上方显示的头）",
        "weight from {q}, mean over all {L}×{h} heads": "{q} 给它的权重：全部 {L}×{h} 个头的平均",
        "weight, mean over the real queries and all {L}×{h} heads": "权重：对所有真实查询和全部 {L}×{h} 个头取平均",
        "effect: KL(before ‖ after) of the next-token distribution": "效果：下一个 token 分布的 KL（删除前 ‖ 删除后）",
        "change of log p({y})": "log p({y}) 的变化",
        "Query: the last token {q} (position {i}). Each earlier token is deleted in turn; the effect is how far the next-token distribution moves (KL), and how log p({y}) changes ({y}: the token the model predicts).": "查询：最后一个 token {q}（位置 {i}）。依次删除每个更早的 token；效果是下一个 token 的分布移动了多少（KL），以及 log p({y}) 如何变化（{y}：模型预测的 token）。",
        "model view: every layer (rows) × head (columns); click a head to open it above (orange)": "模型总览：每一层（行）× 每个头（列）；点击一个头即在上方打开它（橙框）",
        "head view: layer {layer}, every head (queries left, keys right)": "头视图：第 {layer} 层的每个头（左为查询，右为键）",
        "line width = weight (8 px for 1; under 0.01 not drawn); hover a head's lines or its colour": "线宽 = 权重（权重 1 为 8 像素；小于 0.01 不画）；把鼠标移到某个头的线或色块上可单独显示它",
        "The neuron and block views need SmolLM2 (q, k after RoPE).": "神经元视图与模块视图需要 SmolLM2（RoPE 之后的 q、k）。",
        "Σ q⊙k = {dot}; × 1/√{d} = {scale} -> score {score}": "Σ q⊙k = {dot}；× 1/√{d} = {scale} -> 分数 {score}",
        "the causal mask hides this key from this query: the model never used this score": "因果遮罩对这个查询隐藏了这个键：模型从未使用这个分数",
        "the score the model's softmax got: {m}; its weight after the softmax: {w}": "模型的 softmax 得到的分数：{m}；softmax 之后的权重：{w}",
        "neuron view: layer {layer}, head {head} (kv head {kv}), query {qi} {q} -> key {ki} {k}": "神经元视图：第 {layer} 层第 {head} 个头（键值头 {kv}），查询 {qi} {q} -> 键 {ki} {k}",
        "q (after RoPE)": "q（RoPE 之后）",
        "k (after RoPE)": "k（RoPE 之后）",
        "block view: the last token {q} through the model, and the next token": "模块视图：最后一个 token {q} 穿过模型，以及下一个 token",
        "embedding": "嵌入",
        "attention (layer {layer})": "注意力（第 {layer} 层）",
        "MLP (layer {layer})": "前馈网络（第 {layer} 层）",
        "residual stream": "残差流",
        "attention": "注意力",
        "MLP": "前馈网络",
        "norm, LM head, softmax": "归一化、输出层、softmax",
        "the middle boxes: layer {layer}; each layer adds attention, then MLP": "中间的方框：第 {layer} 层；每一层先加上注意力，再加上前馈网络",
        "norms of each stage per layer (last token)": "每层各阶段的范数（最后一个 token）",
        "next token: top {k}, p = softmax(logits / T)": "下一个 token：前 {k} 个，p = softmax(logits / T)",
        "heads in the head view": "头视图中的头",
        "neuron view: query position (-1 = the last)": "神经元视图：查询位置（-1 = 最后一个）",
        "key position": "键位置",
        "block view: temperature T": "模块视图：温度 T",
        "top tokens": "前几个 token",
        " (\\x..: the first bytes of a character)": "（\\x..：一个字符的前几个字节）",
        "*The model, head, neuron and block views appear when the sentence has run.*": "*句子运行完后，这里显示模型总览、头视图、神经元视图和模块视图。*",
    }
)

# ---- live experiments (attnlab.lab.experiments and their cells in the notebook): issue 22 §1, §5 ----------------
ZH.update(
    {
        "Experiment: the variance of q·k": "实验：q·k 的方差",
        "Experiment: the mask's fill value and the dtype": "实验：遮罩的填充值与数据类型",
        "Experiment: softmax with and without the max": "实验：减去与不减最大值的 softmax",
        "Experiment: the mistakes, next to the right way": "实验：常见错误，与正确做法并排",
        "Experiment: the online softmax, block by block": "实验：在线 softmax，逐块计算",
        "Experiment: dropout on the weights": "实验：对权重做 dropout",
        "Experiment: the multi-head shapes": "实验：多头注意力的形状",
        "Experiment: the backward pass of your Q, K, V": "实验：你的 Q、K、V 的反向传播",
        "Experiment: T² growth": "实验：T² 增长",
        "Experiment: the cost of attention": "实验：注意力的计算开销",
        "Experiment: doubling the context": "实验：上下文长度翻倍",
        "Experiment: the leak test": "实验：泄漏测试",
        "Experiment: the six invariants on your inputs": "实验：在你的输入上检查六个不变量",
        "samples": "样本数",
        "seed": "随机种子",
        "fill value": "填充值",
        "dtype": "数据类型",
        "logits": "logits（未归一化分数）",
        "key block size": "键块大小",
        "after block": "显示到第几块",
        "dropout p": "dropout 概率 p",
        "heads h": "头数 h",
        "sequence length n": "序列长度 n",
        "batch B": "批大小 B",
        "G_O = ∂L/∂O (empty: all ones)": "G_O = ∂L/∂O（留空：全为 1）",
        "compared with length": "对比的长度",
        "window (keys)": "窗口（键数）",
        "token to change": "要修改的 token",
        "its new key": "它的新键",
        "its new value": "它的新值",
        "on": "开",
        "off": "关",
        "At the article's setting: the article's numbers are marked.": "文章的设置：文章中的数字已标出。",
        "Not the article's setting: recomputed for your values (the article: {what}).": "不是文章的设置：已按你的取值重新计算（文章：{what}）。",
        "the preset's Q, K, V": "预设的 Q、K、V",
        "This experiment reads the lab's Q, K and V.": "这个实验读取实验室里的 Q、K、V。",
        "{label}: expected a whole number from {lo} to {hi}": "{label}：应为 {lo} 到 {hi} 之间的整数",
        "{label}: expected a number from {lo} to {hi}": "{label}：应为 {lo} 到 {hi} 之间的数",
        "d_k = {d}, {n} samples, seed {s}:": "d_k = {d}，{n} 个样本，随机种子 {s}：",
        "(≈ d_k = {d});": "（≈ d_k = {d}）；",
        "(≈ 1).": "（≈ 1）。",
        "The largest of 16 softmax weights, on average: unscaled": "16 个 softmax 权重中最大者的平均值：未缩放",
        "scaled": "缩放后",
        "The fill {f} stored in {dt}:": "填充值 {f} 存成 {dt} 后：",
        "← overflow: a finite fill became −inf": "← 溢出：有限的填充值变成了 −inf",
        "the 2×2 causal example, softmax(S + M)": "2×2 因果算例，softmax(S + M)",
        "a row with every key masked": "所有键都被遮住的一行",
        "all masked": "全部遮住",
        "The fully masked row is NaN: −inf − (−inf) = NaN. Handle such rows explicitly.": "全遮罩行是 NaN：−inf − (−inf) = NaN。这样的行要显式处理。",
        "The fully masked row is a uniform {w}: with a finite fill softmax silently attends to masked keys.": "全遮罩行变成均匀的 {w}：填充值有限时，softmax 会悄悄地关注被遮住的键。",
        "logits: expected one row of at most 8 numbers": "logits：应为一行，最多 8 个数",
        "exp overflows in {dt} above x =": "在 {dt} 中，exp 在 x 超过此值时溢出：",
        "without the max: exp(x)": "不减最大值：exp(x)",
        "without the max: exp(x) / Σ exp(x)": "不减最大值：exp(x) / Σ exp(x)",
        "with the max: exp(x − max) / Σ exp(x − max)": "减去最大值：exp(x − max) / Σ exp(x − max)",
        "the right way: A": "正确做法：A",
        "row sums": "行和",
        "Tick a mistake to see it next to the right way.": "勾选一个错误，把它和正确做法并排查看。",
        "Key block {b} of {n} (keys {keys}):": "第 {b} 个键块，共 {n} 块（键 {keys}）：",
        "running max m_i, running sum l_i and the rescale factor α = exp(m_old − m_new).": "运行最大值 m_i、运行和 l_i，以及重缩放因子 α = exp(m_old − m_new)。",
        "after this block": "处理完这一块之后",
        "O = acc / l_i (the last block)": "O = acc / l_i（最后一块之后）",
        "largest difference from the dense softmax: {d}": "与稠密 softmax 的最大差：{d}",
        "Step on to the last block to divide once: O = acc / l_i.": "走到最后一块，只做一次除法：O = acc / l_i。",
        "causal-4, p = {p}, seed {s}: Ã = A ∘ keep / (1 − p)": "causal-4，p = {p}，随机种子 {s}：Ã = A ∘ keep / (1 − p)",
        "(not 1, and that is not a bug: the expectation is A)": "（不是 1，这不是 bug：期望值等于 A）",
        "d_model = {d} is not divisible by h = {h}: d_head = d_model / h must be whole": "d_model = {d} 不能被 h = {h} 整除：d_head = d_model / h 必须是整数",
        "split into heads": "拆分成多个头",
        "concat": "拼接",
        "computed by attnlab.multi_head_attention on random inputs (seed 0); the shapes are read from its result.": "由 attnlab.multi_head_attention 在随机输入（随机种子 0）上计算；形状读自它的结果。",
        "largest difference of the hand formulas from:": "手算公式与下列结果的最大差：",
        "{a} -> {b} tokens:": "{a} -> {b} 个 token：",
        "elements,": "个元素，",
        "({x}x the length); {m} MiB per head in float32": "（长度 {x} 倍）；float32 下每个头 {m} MiB",
        "n = {n}, d_model = {d}, h = {h}:": "n = {n}，d_model = {d}，h = {h}：",
        "projections": "投影",
        "score matrix": "分数矩阵",
        "The n² term overtakes the projections at n ≈": "n² 项超过投影开销的长度约为 n ≈",
        "KV cache at this n (32 layers, 8 KV heads of 128, float16):": "这个 n 下的 KV Cache（32 层，8 个宽 128 的 KV 头，float16）：",
        "the score elements,": "分数元素，",
        "with a window of {w} keys,": "使用 {w} 个键的窗口时，",
        "the KV cache.": "KV Cache。",
        "key and value: expected one row of 2 numbers each": "键和值：各应为一行 2 个数",
        "Token {j} gets key {k} and value {v}; how far does each output move?": "token {j} 的键改为 {k}、值改为 {v}；每个输出变化多少？",
        "Every query may see token 0, so every output may move; change a later token to test.": "每个查询都能看到 token 0，所以每个输出都可能变化；改一个更靠后的 token 来测试。",
        "Under the causal mask {rows} moved: a leak.": "在因果遮罩下 {rows} 变化了：信息泄漏。",
        "Under the causal mask the queries before token {j} do not move (q0 … q{k}: 0); written the wrong way round, the mask lets them read the future.": "在因果遮罩下，token {j} 之前的查询不变（q0 … q{k}：0）；遮罩写反时，它们能读到未来。",
        "q0 moves": "q0 变化",
        "at most 8 rows and 8 columns here": "这里最多 8 行、8 列",
        "masked A_ij = 0: largest |A_ij| over masked (i, j) =": "被屏蔽的 A_ij = 0：被屏蔽位置上最大的 |A_ij| =",
        "rows sum to 1:": "每行的和为 1：",
        "violations": "处违反",
        "the shapes do not fit": "形状不匹配",
        "*This lesson does not use Q, K and V: its experiment is above.*": "*这一课不用 Q、K、V：它的实验在上面。*",
        "Changed: this is the preset's original output, for the preset's inputs; the numbers below are computed from yours. Choose the preset again to go back.": "已修改：这是预设的原始输出，对应预设的输入；下面的数字按你的输入计算。重新选择该预设即可恢复。",
    }
)


register("lab", {en: (en, zh) for en, zh in ZH.items()})
