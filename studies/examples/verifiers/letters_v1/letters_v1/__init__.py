from letters_v1.taskset import LettersTaskset

__all__ = ["LettersTaskset"]
