"""Widgets shared by the screens: the mode bar, the verdict, figures and bars."""
