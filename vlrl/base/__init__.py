"""The base layer: what every other layer may use, and which imports nothing of vlrl above it.

It owns the error family (`errors`), where vlrl caches what it builds (`cache`), several processes of one run
(`distributed`), durations and progress lines (`progress`), any image form to RGB (`images`), the generated
visual-math items (`synthetic`) and the statistics (`stats`). It imports nothing from vlrl outside this package; it
may import torch only inside functions, so `import vlrl` stays light.
"""
