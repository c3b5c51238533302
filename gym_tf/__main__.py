from gym_tf.cli import main

main()
