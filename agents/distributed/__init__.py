"""Distributed training: `learner` (the learner service, one for every algorithm, and the served
demos' driver), `learner_cli` (``replaygpu learner``: its loop and what it shows); the actors
(`actor_config`, `actor`, `experience`, the vector, frame and recurrent kinds; no TensorFlow),
`actor_cli`, `fleet` (actor processes beside a learner) and `ray_actors`."""
