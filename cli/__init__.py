"""The front door: every `grpo-studio …` command. Importing it loads neither torch nor textual;
each command imports what it needs when it runs."""
