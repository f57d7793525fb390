"""Readers of model output written as people write it: decisions, stances, figures.

The builtin judge uses them to read answers from any SUT (not only the builtin one), and the
metrics use them to map an LLM judge's reading onto the configured labels. Each reader returns
``None`` when the text does not say what it looks for: the caller then excludes the item and
counts it, it never guesses.

One module per thing read:

- :mod:`.text`: whether an answer says anything (``is_whitespace``, ``is_blank``; ``<think>`` blocks);
- :mod:`.decisions`: the decision an answer states (``read_decision``), a judge's reading mapped
  onto the labels (``map_label``, ``label_at_start``), the words put where a label should be
  (``stated_words``, ``stated_word_counts``);
- :mod:`.stances`: the yes or no an answer takes (``read_stance``);
- :mod:`.figures`: the figures an answer states (``read_figures``, ``Figure``, ``values``) and how
  two answers' figures relate (``compare_figures``);
- :mod:`.judge_json`: the JSON objects in a judge's answer (``scan_json``, ``json_objects``).
"""
