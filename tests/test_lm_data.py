"""The language-model tasks: stream format, metric, loaders, generators and their caches."""

import re
import zipfile
from collections import defaultdict

import numpy as np
import pytest

from analysis import collision_probe as probe
from analysis import instruction_probe
from lm import (
    IGNORE,
    DataNotFoundError,
    Split,
    TaskDataError,
    answer_accuracy,
    copy_task,
    load_task,
    source_rows,
)
from lm import collision as col
from lm.data import _load_enwik8, load_enwik8
from lm.instruction import NEWLINE, UNK, Story, encode_story, load_instruction, split_story
from lm.tasks import task_options

# ------------------------------------------------------------------ format and metric


def test_answer_accuracy_counts_a_span_right_only_if_all_its_tokens_are():
    targets = np.array([5, 1, 2, IGNORE, 3, 4, 7, 8])
    answer_id = np.array([-1, 0, 0, 0, 1, 1, -1, 2])
    split = Split(np.zeros(8, dtype=np.int64), targets, answer_id)
    assert answer_accuracy(targets, split) == 1.0
    # a wrong token outside every span and at an ignored target change nothing
    assert answer_accuracy(np.array([9, 1, 2, 9, 3, 4, 0, 8]), split) == 1.0
    assert answer_accuracy(np.array([5, 1, 0, 0, 3, 4, 7, 8]), split) == pytest.approx(2 / 3)
    assert answer_accuracy(np.array([5, 0, 0, 0, 0, 0, 7, 0]), split) == 0.0
    # the same on the batchified (2, 4) layout
    assert answer_accuracy(
        np.array([[5, 1, 0, 0], [3, 4, 7, 8]]), split.batchify(2)
    ) == pytest.approx(2 / 3)


def test_answer_accuracy_edge_cases():
    no_spans = Split(np.zeros(3), np.zeros(3), np.full(3, IGNORE))
    assert np.isnan(answer_accuracy(np.zeros(3), no_spans))
    with pytest.raises(ValueError, match="bits per byte"):
        answer_accuracy(np.zeros(3), Split(np.zeros(3), np.zeros(3)))
    with pytest.raises(ValueError, match="shape"):
        answer_accuracy(np.zeros(4), no_spans)


def test_batchify_keeps_rows_contiguous_and_drops_a_span_cut_at_the_tail():
    n = 11
    split = Split(np.arange(n), np.arange(n) + 100, np.array([-1, 0, 0, -1, 1, -1, 2, 2, 3, 3, 3]))
    rows = split.batchify(3)  # 3 rows of 3, positions 9 and 10 dropped
    assert rows.inputs.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert rows.targets.ravel().tolist() == list(range(100, 109))
    # span 3 (positions 8..10) lost its tail, so it leaves the metric; span 2 stays
    assert rows.answer_id.ravel().tolist() == [-1, 0, 0, -1, 1, -1, 2, 2, -1]
    assert rows.num_answers == 3
    assert split.head(7).answer_id.tolist() == [-1, 0, 0, -1, 1, -1, -1]
    with pytest.raises(TaskDataError, match="12 rows"):
        split.batchify(12)


# ------------------------------------------------------------------ byte-level text


def synthetic_bytes(size: int) -> bytes:
    return np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()


def check_byte_split(split: Split, part: bytes) -> None:
    assert split.inputs.tobytes() == part[:-1]
    assert split.targets.tobytes() == part[1:]
    assert split.answer_id is None


def test_source_rows_match_names_and_scale_grown_numbered_families():
    source = ["x0", "x1", "red", "quadrant0", "quadrant1"]
    vocab = ["x0", "x1", "x2", "x3", "red", "blue", "quadrant0", "quadrant1"]
    # x_j from x_(j * 2 // 4); quadrants kept their size and keep their names; blue is new
    assert source_rows(vocab, source).tolist() == [0, 0, 1, 1, 2, -1, 3, 4]
    assert source_rows(source, vocab).tolist() == [0, 2, 4, 6, 7]  # shrinking: x_j from x_2j


@pytest.mark.parametrize("zipped", [False, True])
def test_enwik8_split_boundaries(tmp_path, zipped):
    raw = synthetic_bytes(1010)  # bytes past the first 1000 are not used
    if zipped:
        with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as archive:
            archive.writestr("enwik8", raw)
    else:
        (tmp_path / "enwik8").write_bytes(raw)
    data = _load_enwik8(tmp_path, (900, 60, 40))
    check_byte_split(data.train, raw[:900])
    check_byte_split(data.valid, raw[900:960])
    check_byte_split(data.test, raw[960:1000])
    assert data.vocab_size == 256 and data.metric == "bpb"
    assert data.decode(np.frombuffer(b"caf\xc3\xa9", np.uint8)) == "café"


def test_enwik8_zip_must_hold_enwik8(tmp_path):
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as archive:
        archive.writestr("a.txt", b"a")
        archive.writestr("b.txt", b"b")
    with pytest.raises(TaskDataError, match="not a file named 'enwik8'"):
        _load_enwik8(tmp_path, (900, 60, 40))
    (tmp_path / "enwik8.zip").write_bytes(b"not a zip")
    with pytest.raises(TaskDataError, match="not a readable zip"):
        _load_enwik8(tmp_path, (900, 60, 40))


def test_enwik8_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(DataNotFoundError) as error:
        load_enwik8(tmp_path)
    message = str(error.value)
    assert str(tmp_path.resolve()) in message
    assert "enwik8.zip" in message and "http://mattmahoney.net/dc/enwik8.zip" in message


def test_enwik8_truncated_file_is_an_error(tmp_path):
    (tmp_path / "enwik8").write_bytes(synthetic_bytes(999))
    with pytest.raises(TaskDataError, match="truncated"):
        _load_enwik8(tmp_path, (900, 60, 40))


def test_text_task_splits_by_fraction(tmp_path):
    path = tmp_path / "corpus.txt"
    raw = synthetic_bytes(1000)
    path.write_bytes(raw)
    data = load_task("text", path=str(path), valid_fraction=0.1, test_fraction=0.05)
    check_byte_split(data.train, raw[:850])
    check_byte_split(data.valid, raw[850:950])
    check_byte_split(data.test, raw[950:])


def test_text_task_bad_input(tmp_path):
    with pytest.raises(DataNotFoundError, match="does not exist"):
        load_task("text", path=str(tmp_path / "missing.txt"))
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello world")
    with pytest.raises(TaskDataError, match="11 bytes, too few"):
        load_task("text", path=str(small))
    with pytest.raises(TaskDataError, match="nothing to train"):
        load_task("text", path=str(small), valid_fraction=0.5, test_fraction=0.5)


def test_load_task_rejects_unknown_names_and_options():
    with pytest.raises(TaskDataError, match="choose one of enwik8, text"):
        load_task("wikitext")
    with pytest.raises(TaskDataError, match="no option distanse; its options are distance"):
        load_task("copy", distanse=3)


# ------------------------------------------------------------------ collision


def reference_motion(num_steps, grid_size, speed, rng):
    """The rule step by step: add the velocity, redrawn while the step would leave the grid."""
    upper = grid_size - 1
    position = rng.uniform(0, upper, size=2)
    velocity = rng.normal(0, speed, size=2)
    positions = [position]
    for _ in range(num_steps - 1):
        while not ((position + velocity > 0) & (position + velocity < upper)).all():
            velocity = rng.normal(0, speed, size=2)
        position = position + velocity
        positions.append(position)
    return np.array(positions)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_motion_matches_the_step_by_step_rule(seed):
    fast = col.simulate_motion(5000, 16, 0.5, np.random.default_rng(seed))
    slow = reference_motion(5000, 16, 0.5, np.random.default_rng(seed))
    np.testing.assert_allclose(fast, slow, atol=1e-9)


def test_particles_never_leave_the_grid_and_do_bounce():
    rules = col.CollisionRules()
    world = col.simulate(200_000, rules, 3)
    assert (world.positions > 0).all() and (world.positions < 15).all()
    assert world.cells.min() == 0 and world.cells.max() == 15
    steps = np.diff(world.positions, axis=0)
    turns = (np.abs(np.diff(steps, axis=0)) > 1e-9).any(axis=2).mean()
    assert 0.02 < turns < 0.2  # velocities are redrawn every few tens of steps


def test_colours_change_at_the_configured_rate():
    world = col.simulate(200_000, col.CollisionRules(), 4)
    rate = (world.colours[1:] != world.colours[:-1]).mean()
    assert rate == pytest.approx(0.05, abs=0.002)  # std of the estimate is 0.0003
    assert set(np.unique(world.colours)) == set(range(5))


def test_collisions_are_the_steps_where_particles_come_to_share_a_cell():
    world = col.simulate(100_000, col.CollisionRules(), 5)
    cells = np.floor(world.positions + 0.5).astype(int)
    shared = [bool((cells[t, 0] == cells[t, 1]).all()) for t in range(len(cells))]
    expected = [t for t in range(len(cells)) if shared[t] and (t == 0 or not shared[t - 1])]
    assert world.collision_steps.tolist() == expected
    assert len(expected) > 100


def test_forty_percent_of_questions_name_the_last_collision():
    rules = col.CollisionRules()
    world = col.simulate(100_000, rules, 6)
    pairs = world.colours[:, 0] * 5 + world.colours[:, 1]
    after_first = np.arange(len(pairs)) >= world.collision_steps[0]
    last = world.collision_steps[
        np.searchsorted(world.collision_steps, np.arange(len(pairs)), side="right") - 1
    ]
    share = (world.questions == pairs[last])[after_first].mean()
    assert share == pytest.approx(0.4, abs=0.01)
    # the other questions are spread over the 24 other ordered pairs
    others = world.questions[after_first & (world.questions != pairs[last])]
    assert len(np.unique(others)) == 25


def reference_answers(world, rules):
    """Slow bookkeeping: a table of the last collision per colour pair, updated every step."""
    answers = []
    last_by_pair, recent = {}, []
    for t in range(len(world.cells)):
        if t in set(world.collision_steps.tolist()):
            (x, y), half = world.cells[t, 0], rules.grid_size // 2
            quadrant = 2 * int(y >= half) + int(x >= half)
            recent.insert(0, quadrant)
            if rules.hard:
                last_by_pair[(world.colours[t, 0], world.colours[t, 1])] = quadrant
        if rules.hard:
            asked = divmod(int(world.questions[t]), rules.num_colors)
            answers.append([last_by_pair.get(asked, IGNORE)])
        elif world.questions[t] == 0:
            answers.append([recent[0] if recent else IGNORE] + [IGNORE] * (rules.num_recent - 1))
        elif len(recent) >= rules.num_recent:
            answers.append(recent[: rules.num_recent])
        else:
            answers.append([IGNORE] * rules.num_recent)
    return np.array(answers)


@pytest.mark.parametrize("hard", [True, False])
def test_answers_match_a_slow_reference(hard):
    rules = col.CollisionRules(hard=hard, grid_size=8)  # a small grid: collisions are frequent
    world = col.simulate(8000, rules, 7)
    assert len(world.collision_steps) > 50
    np.testing.assert_array_equal(world.answers, reference_answers(world, rules))
    assert (world.answers != IGNORE).any(axis=1).mean() > 0.5


def test_baseline_errors_against_every_constant_and_a_slow_last_collision():
    rules = col.CollisionRules(grid_size=8)
    world = col.simulate(8000, rules, 7)
    answers = world.answers[:, 0]
    scored = answers != IGNORE
    baselines = col.baseline_errors(world, rules)
    every_constant = [(answers[scored] != q).mean() for q in range(col.NUM_QUADRANTS)]
    assert baselines["constant_error"] == pytest.approx(min(every_constant))
    last, hits, collisions = None, [], set(world.collision_steps.tolist())
    for t in range(len(answers)):
        if t in collisions:
            last = int(col.quadrant(world.cells[t, 0], rules.grid_size))
        if scored[t]:
            hits.append(last == answers[t])
    assert baselines["last_collision_error"] == pytest.approx(1 - np.mean(hits))
    # questions that always name the last collision are answered by it
    always_last = col.CollisionRules(grid_size=8, last_collision_question_prob=1.0)
    world = col.simulate(8000, always_last, 7)
    assert col.baseline_errors(world, always_last)["last_collision_error"] == 0.0


def test_easy_baseline_errors_count_an_answer_right_only_if_all_its_slots_are():
    rules = col.CollisionRules(hard=False, grid_size=8)
    world = col.simulate(8000, rules, 7)
    baselines = col.baseline_errors(world, rules)
    last, recent_hits, constant_hits, collisions = None, [], [], set(world.collision_steps.tolist())
    for t, answer in enumerate(world.answers):
        if t in collisions:
            last = int(col.quadrant(world.cells[t, 0], rules.grid_size))
        asked = [int(a) for a in answer if a != IGNORE]
        if asked:
            recent_hits.append(all(a == last for a in asked))
            constant_hits.append([all(a == q for a in asked) for q in range(col.NUM_QUADRANTS)])
    assert baselines["last_collision_error"] == pytest.approx(1 - np.mean(recent_hits))
    assert baselines["constant_error"] == pytest.approx(1 - np.mean(constant_hits, axis=0).max())
    # the last collision answers every "?last" question and only some "?recent" ones
    assert 0 < baselines["last_collision_error"] < 0.5
    only_last = col.CollisionRules(hard=False, grid_size=8, recent_question_prob=0.0)
    world = col.simulate(8000, only_last, 7)
    assert col.baseline_errors(world, only_last)["last_collision_error"] == 0.0


def easy_ages(world, rules):
    """Slow bookkeeping: per step, how far back the oldest collision its question needs is."""
    ages, seen, collisions = [], [], set(world.collision_steps.tolist())
    for t in range(len(world.answers)):
        if t in collisions:
            seen.insert(0, t)
        needed = 1 if world.questions[t] == 0 else rules.num_recent
        ages.append(t - seen[needed - 1] if len(seen) >= needed else -1)
    return np.array(ages)


def test_easy_probe_groups_questions_by_how_far_back_their_oldest_collision_is():
    rules = col.CollisionRules(hard=False, grid_size=4)
    world = col.simulate(3000, rules, 5)
    scored = (world.answers != IGNORE).any(axis=1)
    age, recent = easy_ages(world, rules), world.questions == 1
    # right where the collisions needed are under 64 steps back; else the oldest slot is wrong
    far = scored & (age >= 64)
    oldest_slot = np.where(recent, rules.num_recent - 1, 0)
    predicted = world.answers.copy()
    predicted[far, oldest_slot[far]] = (predicted[far, oldest_slot[far]] + 1) % 4
    groups = probe.easy_error_groups(world, rules, predicted)
    assert groups["all"] == {
        "error": pytest.approx(far.sum() / scored.sum()),
        "count": scored.sum(),
    }
    assert groups["?last"]["count"] + groups["?recent"]["count"] == scored.sum()
    for question, mask, label in [
        ("?last", ~recent, "?last,"),
        ("?recent", recent, "?recent, oldest"),
    ]:
        bins = {name: g for name, g in groups.items() if name.startswith(f"{label} ")}
        assert len(bins) == len(probe.EASY_AGE_BINS)
        assert sum(g["count"] for g in bins.values()) == groups[question]["count"]
        assert groups[question]["count"] == (scored & mask).sum()
        assert bins[f"{label} 0-17 steps back"] == {
            "error": 0.0,
            "count": (scored & mask & (age < 18)).sum(),
        }
        errors = [g["error"] for g in bins.values()]  # 0-17, 18-63, 64-127, 128-255, 256+
        assert errors[:3] == [0.0, 0.0, 1.0] and all(e in (1.0, None) for e in errors[3:])
        assert min(g["count"] for g in list(bins.values())[:3]) > 10


def test_easy_probe_counts_a_recent_answer_with_one_wrong_slot_wrong_and_ignores_unscored_slots():
    rules = col.CollisionRules(hard=False, grid_size=4)
    world = col.simulate(2000, rules, 5)
    scored = (world.answers != IGNORE).any(axis=1)
    predicted = np.where(world.answers == IGNORE, 9, world.answers)  # unscored slots: not 0..3
    assert probe.easy_error_groups(world, rules, predicted)["all"]["error"] == 0.0
    t = np.flatnonzero(scored & (world.questions == 1))[0]
    predicted[t, 1] = (predicted[t, 1] + 1) % 4  # the middle of three: two right, one wrong
    groups = probe.easy_error_groups(world, rules, predicted)
    assert groups["?recent"]["error"] == pytest.approx(1 / groups["?recent"]["count"])
    assert groups["?last"]["error"] == 0.0
    assert groups["all"]["error"] == pytest.approx(1 / scored.sum())


def test_probe_groups_questions_by_the_pair_they_name_and_the_answers_age():
    rules = col.CollisionRules(grid_size=4)
    world = col.simulate(3000, rules, 5)
    answers = world.answers[:, 0]
    steps = np.arange(answers.size)
    last = np.searchsorted(world.collision_steps, steps, side="right") - 1
    groups = probe.error_groups(world, rules, answers)
    scored = int((answers != IGNORE).sum())
    assert groups["all"] == {"error": 0.0, "count": scored}
    last_pair_groups = [g for name, g in groups.items() if name.startswith("last pair")]
    assert groups["other pair"]["count"] + sum(g["count"] for g in last_pair_groups) == scored
    # wrong exactly where the question names the pair of the last collision, 0-15 steps back
    age = steps - world.collision_steps[np.maximum(last, 0)]
    pairs = world.colours[world.collision_steps, 0] * rules.num_colors
    pairs += world.colours[world.collision_steps, 1]
    names_last = (last >= 0) & (world.questions == pairs[np.maximum(last, 0)])
    recent = names_last & (age < 16) & (answers != IGNORE)
    groups = probe.error_groups(world, rules, np.where(recent, (answers + 1) % 4, answers))
    assert groups["last pair, 0-15 steps back"] == {"error": 1.0, "count": int(recent.sum())}
    assert groups["other pair"]["error"] == groups["last pair, 16-63 steps back"]["error"] == 0
    assert groups["all"]["error"] == pytest.approx(recent.sum() / scored)


@pytest.mark.parametrize("hard", [True, False])
def test_collision_tokens_spell_the_world(hard):
    rules = col.CollisionRules(hard=hard)
    world = col.simulate(3000, rules, 8)
    split = col.encode(world, rules)
    frame = rules.tokens_per_step
    words = np.array(rules.vocab)[split.inputs.reshape(-1, frame)]
    t = int(world.collision_steps[-1])
    (xa, ya), (xb, yb) = world.cells[t]
    assert words[t, :4].tolist() == [f"x{xa}", f"y{ya}", f"x{xb}", f"y{yb}"]
    targets = split.targets.reshape(-1, frame)
    scored = world.answers != IGNORE
    quadrant_words = np.array(rules.vocab)[targets[:, -scored.shape[1] :][scored]]
    assert quadrant_words.tolist() == [f"quadrant{q}" for q in world.answers[scored]]
    assert (targets[:, : frame - scored.shape[1]] == IGNORE).all()
    if hard:
        colours = rules.colours
        a, b = world.colours[t]
        qa, qb = divmod(int(world.questions[t]), 5)
        assert words[t, 4:].tolist() == [
            colours[a],
            colours[b],
            f"?{colours[qa]}",
            f"?{colours[qb]}",
        ]
    else:
        assert words[t, 4] == ("?last", "?recent")[world.questions[t]]
        assert words[t, 5:].tolist() == ["wait"] * (rules.num_recent - 1)
    # one span per answered step, each span in one frame
    answer_id = split.answer_id.reshape(-1, frame)
    assert split.num_answers == scored.any(axis=1).sum()
    assert all(len(np.unique(row[row != IGNORE])) <= 1 for row in answer_id)


def test_collision_cache_returns_the_same_data_and_tracks_every_parameter(tmp_path, monkeypatch):
    options = dict(train_steps=2000, valid_steps=500, test_steps=500, cache_dir=tmp_path)
    first = load_task("collision", **options)
    assert len(list(tmp_path.glob("collision-*.npz"))) == 1

    def fail(*args):
        raise AssertionError("the cached data should have been used")

    monkeypatch.setattr(col, "simulate", fail)
    second = load_task("collision", **options)
    for split in ("train", "valid", "test"):
        for part in ("inputs", "targets", "answer_id"):
            a, b = getattr(first.split(split), part), getattr(second.split(split), part)
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
    assert (second.vocab, second.metric, second.info) == (first.vocab, first.metric, first.info)
    changes = dict(seed=1, hard=False, speed=0.6, color_change_prob=0.1, test_steps=501)
    for option, value in changes.items():
        with pytest.raises(AssertionError, match="cached"):
            load_task("collision", **{**options, option: value})


def test_collision_splits_differ_and_seeds_repeat():
    a = load_task("collision", train_steps=1000, valid_steps=1000, test_steps=1000)
    b = load_task("collision", train_steps=1000, valid_steps=1000, test_steps=1000)
    np.testing.assert_array_equal(a.train.inputs, b.train.inputs)
    assert not np.array_equal(a.train.inputs, a.valid.inputs)
    assert a.metric == "error" and a.vocab_size == 46


# ------------------------------------------------------------------ copy


def parse_copy(split):
    text = "".join(copy_task.VOCAB[i] for i in split.inputs)
    return re.findall(r"(A+)(B+)=(A+)\.", text)


def test_copy_episodes_have_the_documented_format():
    split = copy_task.generate_copy(200, 10, 4, np.random.default_rng(0))
    episodes = parse_copy(split)
    text = "".join(copy_task.VOCAB[i] for i in split.inputs)
    assert "".join(a + b + "=" + c + "." for a, b, c in episodes) == text
    assert len(episodes) == 200
    assert all(len(b) == 10 and a == c for a, b, c in episodes)
    assert {len(a) for a, _, _ in episodes} == {1, 2, 3, 4}
    # targets only on the answer: from the query to the last A, each the next token
    scored = split.targets != IGNORE
    assert scored.sum() == sum(len(a) + 1 for a, _, _ in episodes)
    np.testing.assert_array_equal(
        split.targets[scored], np.append(split.inputs[1:], copy_task.STOP)[scored]
    )
    assert (split.answer_id[scored] == np.cumsum(split.inputs == copy_task.QUERY)[scored] - 1).all()
    assert answer_accuracy(split.targets, split) == 1.0


def answer_given_window(split, window):
    """For each scored position: its last `window` inputs -> the targets seen after them."""
    seen = defaultdict(set)
    for t in np.flatnonzero(split.targets != IGNORE):
        seen[tuple(split.inputs[max(0, t - window + 1) : t + 1])].add(int(split.targets[t]))
    return seen


def test_copy_needs_a_memory_longer_than_the_distance():
    distance, max_count = 12, 4
    split = copy_task.generate_copy(400, distance, max_count, np.random.default_rng(1))
    # what the last `distance` tokens show leaves the stop decision open ...
    short = answer_given_window(split, distance)
    assert sum(len(targets) > 1 for targets in short.values()) == max_count - 1
    # ... while a window reaching back over the whole episode decides every answer token
    long = answer_given_window(split, distance + 2 * max_count + 1)
    assert all(len(targets) == 1 for targets in long.values())
    # without memory the best is to guess a count c: right exactly when n == c
    guess_of_2, written = np.full(len(split), IGNORE), 0
    for t in np.flatnonzero(split.targets != IGNORE):
        written = 0 if split.inputs[t] == copy_task.QUERY else written + 1
        guess_of_2[t] = copy_task.STOP if written == 2 else copy_task.A
    counts = np.array([len(a) for a, _, _ in parse_copy(split)])
    assert answer_accuracy(guess_of_2, split) == (counts == 2).mean()
    assert abs((counts == 2).mean() - 1 / max_count) < 0.07


# ------------------------------------------------------------------ instruction


def parse_story(data, split):
    """Read the stream back as text lines and replay the instructions it gives."""
    tokens = [data.vocab[i] for i in np.append(split.inputs, split.targets[-1])]
    lines, start = [], 0
    for end, token in enumerate(tokens):
        if token == NEWLINE:
            lines.append((start, " ".join(tokens[start:end])))
            start = end + 1
    given = re.compile(
        r'the (.+) says " can you tell the (.+) that the (.+) wants to see them \? "$'
    )
    executed = re.compile(r'you tell the (.+) " (.+) wants to see you ! "$')
    pending, distances, executions, max_pending = {}, [], [], 0
    present, owed = [], set()  # owed: receivers present who must be told now
    for start, line in lines:
        if match := executed.match(line):
            receiver, sender = match.groups()
            assert receiver in owed and pending[receiver][0] == sender
            owed.remove(receiver)
            distances.append(start - pending.pop(receiver)[1])
            executions.append((start, line))
            continue
        assert not owed, f"{owed} present but not told, before {line!r}"
        if line.startswith("here is") or line.startswith("here are"):
            present = re.findall(r"the ([a-z ]+?)(?= ,| and| \.)", line)
            owed = set(present) & set(pending)
        elif match := given.match(line):
            speaker, receiver, sender = match.groups()
            assert speaker == sender and speaker in present
            assert receiver not in pending and receiver not in present
            pending[receiver] = (sender, start + len(line.split()) + 1)
            max_pending = max(max_pending, len(pending))
    return executions, distances, max_pending


def test_instructions_are_executed_where_the_receiver_is_after_the_configured_distance():
    data = load_instruction(
        mean_distance=300, train_tokens=300_000, valid_tokens=2000, test_tokens=2000
    )
    executions, distances, max_pending = parse_story(data, data.train)
    assert len(executions) > 200
    assert np.mean(distances) == pytest.approx(300, rel=0.06)
    assert min(distances) >= 150 - 30 and np.percentile(distances, 99) < 450 + 80
    assert max_pending >= 3
    # every answer span is exactly the execution line, predicted from the token before it
    assert data.train.num_answers == len(executions)
    for span, (start, line) in enumerate(executions):
        positions = np.flatnonzero(data.train.answer_id == span)
        assert positions[0] == start - 1
        assert data.decode(data.train.targets[positions]) == line


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_split_story_is_the_story_behind_each_split(split):
    options = task_options("instruction") | dict(
        mean_distance=100, train_tokens=4000, valid_tokens=3000, test_tokens=2000, seed=3
    )
    data = load_task("instruction", **options)
    story = split_story(options, split)
    again, expected = encode_story(story, data.vocab), getattr(data, split)
    for name in ("inputs", "targets", "answer_id"):
        np.testing.assert_array_equal(getattr(again, name), getattr(expected, name))
    assert sum(i.executed is not None for i in story.instructions) == expected.num_answers > 5


def test_instruction_probe_scores_each_part_and_distance_of_the_executions():
    """Right predictions everywhere score 1; a wrong sender in every other execution halves
    the sender's and the whole line's accuracy and leaves the other parts right."""
    options = task_options("instruction") | dict(
        mean_distance=200, train_tokens=1000, valid_tokens=20_000, test_tokens=1000
    )
    data = load_task("instruction", **options)
    story = split_story(options, "valid")
    executed = [i for i in story.instructions if i.executed is not None]
    predicted = data.valid.targets.astype(np.int64).copy()
    result = instruction_probe.execution_accuracy(story.instructions, data.valid, predicted, 64)
    assert result["count"] == len(executed) == data.valid.num_answers > 20
    assert result["accuracy"] == 1.0
    assert {part: r["accuracy"] for part, r in result["parts"].items()} == dict.fromkeys(
        instruction_probe.PARTS, 1.0
    )
    distances = np.array([i.executed[0] - i.given_end for i in executed])
    assert 64 <= distances.min() and distances.max() < 512  # blocks of 64: bins 1, 2, 4, 8 K
    edges = (64, 128, 256, 512)
    expected = {f"{lo}-{hi - 1}": int(((distances >= lo) & (distances < hi)).sum())
                for lo, hi in zip(edges, edges[1:], strict=False)}  # fmt: skip
    counts = {name: r["count"] for name, r in result["by_distance"].items()}
    assert counts == {name: n for name, n in expected.items() if n}
    for instruction in executed[::2]:  # the sender's first word, wrong
        offset = instruction_probe.part_offsets(instruction)["sender"].start
        predicted[instruction.executed[0] - 1 + offset] += 1
    result = instruction_probe.execution_accuracy(story.instructions, data.valid, predicted, 64)
    halved = (len(executed) // 2) / len(executed)
    assert result["accuracy"] == result["parts"]["sender"]["accuracy"] == pytest.approx(halved)
    assert result["parts"]["whether"]["accuracy"] == result["parts"]["receiver"]["accuracy"] == 1
    assert result["accuracy"] == pytest.approx(answer_accuracy(predicted, data.valid))
    # an execution cut by the end of what was read is not scored
    cut = executed[-1].executed[0] + 1
    shorter = instruction_probe.execution_accuracy(
        story.instructions, data.valid, predicted[:cut], 64
    )
    assert shorter["count"] == len(executed) - 1


def test_default_instruction_distance_is_about_950_tokens():
    data = load_instruction(train_tokens=200_000, valid_tokens=2000, test_tokens=2000)
    _, distances, _ = parse_story(data, data.train)
    assert np.mean(distances) == pytest.approx(950, rel=0.08)
    assert data.info["measured_mean_distance"] == pytest.approx(950, rel=0.08)


def test_distractor_file_lines_are_spoken_and_rare_words_become_unk(tmp_path):
    path = tmp_path / "dialogue.txt"
    lines = ["Hello there, my friend!", "The ZEPHYR blows today.", "", "hello again friend"]
    path.write_text("\n".join(lines) * 50 + "\nqwertyuiop once\n")
    base = dict(train_tokens=5000, valid_tokens=500, test_tokens=500, distractor_file=path)
    data = load_instruction(**base)
    text = data.decode(data.train.inputs)
    assert 'says " hello there , my friend ! "' in text and "zephyr" in data.vocab
    small = load_instruction(**base, max_vocab=len(data.vocab) - 2)
    assert "qwertyuiop" not in small.vocab and "once" not in small.vocab
    assert "zephyr" in small.vocab  # the frequent words stay
    encoded = encode_story(Story(tokens=["qwertyuiop", "zephyr", NEWLINE]), small.vocab)
    assert [small.vocab[i] for i in encoded.inputs] == [UNK, "zephyr"]
    with pytest.raises(DataNotFoundError, match="distractor_file"):
        load_instruction(**{**base, "distractor_file": tmp_path / "nope.txt"})


def test_instruction_cache_key_follows_the_distractor_file_content(tmp_path):
    path = tmp_path / "dialogue.txt"
    options = dict(train_tokens=3000, valid_tokens=300, test_tokens=300, cache_dir=tmp_path / "c")
    path.write_text("first version\n")
    a = load_task("instruction", **options, distractor_file=str(path))
    path.write_text("second version\n")
    b = load_task("instruction", **options, distractor_file=str(path))
    assert len(list((tmp_path / "c").glob("instruction-*.npz"))) == 2
    assert "second" in b.vocab and "second" not in a.vocab
